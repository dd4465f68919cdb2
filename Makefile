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

test: setup
	.venv/bin/ruff check
	.venv/bin/lint-imports
	.venv/bin/python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile --no-loadscope-reorder -m "not serial" --durations=15 -rsx
	.venv/bin/python -m pytest -q -p no:cacheprovider -m serial --durations=15 -rsx

# The unit tier alone, as the unprivileged user nobody: it must need no root, no runc and no network.
test-unit: setup
	tests/support/unprivileged.sh .venv/bin/python -m pytest -q -p no:cacheprovider tests/unit

bench: setup
	.venv/bin/python bench/engine.py --quick
