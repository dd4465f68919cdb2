import sys
from pathlib import Path

path = Path("/app/hello.txt")
if not path.is_file():
    sys.exit(f"{path} is missing")
text = path.read_text()
print(repr(text))
sys.exit(0 if text.strip() == "Hello, world!" else 1)
