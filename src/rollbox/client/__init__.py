"""The SDK: claim sandboxes from a rollbox router and drive them, blocking or with asyncio.

```python
client = SandboxClient("http://127.0.0.1:8080", token="...")
with client.create_sandbox(template="py-bugfix", warmpool="py-bugfix-pool") as sandbox:
    result = sandbox.commands.run("python -m pytest -q", timeout=30)
```
"""

from rollbox.client._leases import AsyncLease, Lease
from rollbox.client.aio import AsyncSandbox, AsyncSandboxClient
from rollbox.client.sync import Sandbox, SandboxClient
from rollbox.errors import ConnectionFailed
from rollbox.models import (
    ApplyEvent,
    ExecResult,
    FileInfo,
    LeaseInfo,
    SandboxInfo,
    SnapshotInfo,
    TemplateInfo,
    VolumeInfo,
    WarmPoolInfo,
)
from rollbox.spec import VolumeMount

__all__ = [
    "ApplyEvent",
    "AsyncLease",
    "AsyncSandbox",
    "AsyncSandboxClient",
    "ConnectionFailed",
    "ExecResult",
    "FileInfo",
    "Lease",
    "LeaseInfo",
    "Sandbox",
    "SandboxClient",
    "SandboxInfo",
    "SnapshotInfo",
    "TemplateInfo",
    "VolumeInfo",
    "VolumeMount",
    "WarmPoolInfo",
]
