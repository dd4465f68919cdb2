"""A fixed list of node agents, for clusters without Ray (a Kubernetes DaemonSet, hosts a script started).

A URL whose host name resolves to several addresses stands for one node per address: a Kubernetes headless
Service of the node agents' DaemonSet lists every agent that way, and the list follows pods as they come and go.
Nodes here are never declared lost: one that stops answering is unreachable until it answers again.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit, urlunsplit

from rollbox.cluster.view import Member


class StaticMembers:
    scales = False

    def __init__(self, urls: list[str]) -> None:
        self.urls = [url.rstrip("/") for url in urls]

    def poll(self, stale: set[str]) -> list[Member]:
        return [Member(url) for url in dict.fromkeys(address for url in self.urls for address in _addresses(url))]

    def want_nodes(self, count: int) -> None:
        """No cluster engine to ask: the operator adds nodes."""

    def release(self, name: str) -> None:
        """The operator removes nodes."""

    def close(self) -> None:
        pass


def _addresses(url: str) -> list[str]:
    """`url` once per address its host resolves to (itself when it is an address, or resolves to nothing now)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return [url]
    addresses = dict.fromkeys(info[4][0] for info in infos)
    if len(addresses) <= 1:
        return [url]
    return [urlunsplit(parts._replace(netloc=f"[{a}]:{port}" if ":" in a else f"{a}:{port}")) for a in addresses]
