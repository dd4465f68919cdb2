import sys

sys.path.insert(0, "/app")
from stats import mean

cases = [([1, 2, 3], 2), ([5], 5), ([1.5, 2.5], 2), ([-4, 4, 9], 3)]
failed = [(values, expected, mean(values)) for values, expected in cases if abs(mean(values) - expected) > 1e-9]
print("failed:", failed)
sys.exit(1 if failed else 0)
