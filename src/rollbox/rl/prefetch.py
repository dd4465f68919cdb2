"""Images of the groups to come, pulled while the current ones play: a group's claim then finds its image on the
node, instead of waiting for a pull in the middle of a batch."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from rollbox.client import AsyncSandboxClient
from rollbox.errors import RollboxError


class Prefetch:
    """Asks the router to prefetch the images of the `ahead` groups after each one that starts (in plan order)."""

    def __init__(self, client: AsyncSandboxClient, images: Sequence[str | None], ahead: int) -> None:
        self.client = client
        self.images = list(images)
        self.ahead = ahead
        self.asked = ahead
        """Groups whose images were asked for (the first `ahead` are claimed at once: their claims pull)."""
        self._pending: set[asyncio.Task[None]] = set()

    def started(self, index: int) -> None:
        """Group `index` starts: the images up to `ahead` groups after it are asked for, each once."""
        until = min(index + 1 + self.ahead, len(self.images))
        wanted = list(dict.fromkeys(image for image in self.images[self.asked:until] if image))
        self.asked = max(self.asked, until)
        if wanted:
            task = asyncio.ensure_future(self._ask(wanted))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _ask(self, images: list[str]) -> None:
        with contextlib.suppress(RollboxError):  # a failed prefetch costs only the time the claim then takes
            await self.client.images.prefetch(*images)
