import os
import sys

if not os.path.isfile("/app/count.txt"):
    sys.exit("/app/count.txt is missing")
answer = open("/app/count.txt").read().strip()
print("answer:", answer)
sys.exit(0 if answer == "16" else 1)
