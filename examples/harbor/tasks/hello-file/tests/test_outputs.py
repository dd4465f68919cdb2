import os
import sys

path = "/app/hello.txt"
if not os.path.isfile(path):
    sys.exit(f"{path} is missing")
text = open(path).read()
print(repr(text))
sys.exit(0 if text.strip() == "Hello, world!" else 1)
