"""One call's bytes over a `PoolTransport`, and its answer read back: the async SDK's way to the router, and the
router's to each node agent of a cluster (which adds the tenant it acts for to every call)."""

from __future__ import annotations

from typing import TypeVar

from rollbox.client._call import Call, StreamCall
from rollbox.client._http import Answer, Settings, error_from
from rollbox.client._transport import PoolTransport, Reply

T = TypeVar("T")


class Exchange:
    """Sends calls to the origin of `settings` over `transport`. Transport errors (httpx's) reach the caller, whose
    policy it is to retry or to explain them."""

    def __init__(self, settings: Settings, transport: PoolTransport) -> None:
        self.settings = settings
        self.transport = transport

    async def whole(self, call: Call[T], headers: dict[str, str] | None = None) -> Answer:
        """The call sent straight to the pool, as bytes: no httpx client's routing, redirects, auth and cookies,
        or request and response models, which would only cost CPU."""
        request = self.settings.written(call.method, call.path, params=call.params, content=call.body,
                                        headers=_merged(call.headers, headers))
        return await self._answer(call, await self.transport.send(request, self.settings.timeouts(call.wait)))

    async def streamed(self, call: StreamCall[T], headers: dict[str, str] | None = None) -> T:
        """The call's result, read from its NDJSON answer line by line as it arrives."""
        request = self.settings.written(call.method, call.path, content=call.body,
                                        headers=_merged(call.headers, headers))
        reply = await self.transport.send(request, self.settings.timeouts(call.wait))
        try:
            if not reply.is_success:
                raise error_from(await self._answer(call, reply))
            answer = call.answer()
            async for line in reply.lines():
                answer.feed(line)
            return answer.result()
        finally:
            reply.close()

    async def _answer(self, call: Call[T] | StreamCall[T], reply: Reply) -> Answer:
        """The reply read whole, as the calls read answers; its path is the one sent, as the sync client's is."""
        return Answer(call.method, self.settings.target(call.path), reply.status_code, reply.reason_phrase,
                      await reply.read())

    async def aclose(self) -> None:
        await self.transport.aclose()


def _merged(headers: dict[str, str] | None, extra: dict[str, str] | None) -> dict[str, str] | None:
    if not extra:
        return headers
    return {**headers, **extra} if headers else extra
