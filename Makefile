# The two commands of the README. Both set up what they need first (as root).
.PHONY: setup demo test lint bench

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/rollbox demo

test: setup
	.venv/bin/ruff check src tests bench
	.venv/bin/python -m pytest -q -p no:cacheprovider

bench: setup
	.venv/bin/python bench/engine.py --quick
