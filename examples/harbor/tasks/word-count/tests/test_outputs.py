import sys
from pathlib import Path

count = Path("/app/count.txt")
if not count.is_file():
    sys.exit(f"{count} is missing")
answer = count.read_text().strip()
print("answer:", answer)
sys.exit(0 if answer == "16" else 1)
