"""One machine's containers: rootfs layers, the OCI runtime, the exec agent, files, limits, state."""

from rollbox.engine.container import Container, ContainerInfo
from rollbox.engine.engine import DEFAULT_DATA_DIR, Engine

__all__ = ["DEFAULT_DATA_DIR", "Container", "ContainerInfo", "Engine"]
