"""The floor of any hop: a proxy that copies bytes between each client connection and one of its own to the upstream,
reading nothing of HTTP. bench/cluster.py puts it in front of the single-machine server beside the router, so that a
run shows what one more process on the way costs on this machine, before any routing, parsing or pooling.

Run as `python bench/tcp_splice.py LISTEN_PORT UPSTREAM_PORT` (both on 127.0.0.1): it serves until terminated.
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast

import uvloop

HOST = "127.0.0.1"


class Half(asyncio.Protocol):
    """One side of a spliced pair: what arrives is written to the other side as it comes."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: Half | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        transport.get_extra_info("socket").setsockopt(6, 1, 1)  # TCP_NODELAY, as the servers set it

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        else:
            self.pending.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def join(self, peer: Half) -> None:
        """Pairs the two sides and hands over what arrived before both were connected."""
        self.peer, peer.peer = peer, self
        for side in (self, peer):
            for data in side.pending:
                side.data_received(data)
            side.pending.clear()


class Downstream(Half):
    """A client's connection: it opens its own connection to the upstream."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__()
        self.upstream_port = upstream_port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(Half, HOST, self.upstream_port)
        except OSError:
            assert self.transport is not None
            self.transport.close()
            return
        self.join(upstream)


async def main(listen_port: int, upstream_port: int) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: Downstream(upstream_port), HOST, listen_port,
                                                            backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]), int(sys.argv[2])))
