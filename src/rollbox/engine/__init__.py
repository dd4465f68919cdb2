"""One sandbox at a time: rootfs layers, the OCI runtime, the exec agent, files, limits, state."""

from rollbox.engine.engine import DEFAULT_DATA_DIR, Engine, Sandbox

__all__ = ["DEFAULT_DATA_DIR", "Engine", "Sandbox"]
