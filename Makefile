# The README's two commands. Both set up what they need first (as root).
.PHONY: setup train demo test test-unit bench

setup:
	@bash scripts/setup.sh

# The main job: train a policy on the example tasks from sandboxed rewards alone (embedded server).
train: setup
	.venv/bin/rollbox-train

# A short tour of the SDK: template, sandbox, exec, files, fork, reset.
demo: setup
	.venv/bin/rollbox demo

PYTEST := .venv/bin/python -m pytest -q -p no:cacheprovider
REPORT := --durations=15 -rsx
# the slowest tests, and every skip and expected failure with its reason

test: setup
	.venv/bin/ruff check
	.venv/bin/lint-imports
	$(PYTEST) -n 3 --dist loadfile --no-loadscope-reorder -m "not serial" $(REPORT)
	$(PYTEST) -m serial $(REPORT)

# The unit tier alone, as the unprivileged user nobody: it must need no root, no runc and no network.
test-unit: setup
	tests/support/unprivileged.sh $(PYTEST) tests/unit

bench: setup
	.venv/bin/python bench/engine.py --quick
