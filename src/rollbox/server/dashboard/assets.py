"""The pages' files, read once from the package, and the headers that lock each page to them.

Served from a fixed table by name, so no request names a path on the host. The Content-Security-Policy
lets a page run only these scripts and styles and talk only to its own origin: no inline script, no
remote origin, no frames, no forms posted anywhere.
"""

from __future__ import annotations

from importlib import resources

from starlette.responses import Response

from rollbox.errors import NotFound

MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8"}
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {"content-security-policy": CONTENT_SECURITY_POLICY, "x-content-type-options": "nosniff",
                    "referrer-policy": "no-referrer", "x-frame-options": "DENY", "cache-control": "no-store"}


class Assets:
    """The files of `static/`, by name."""

    def __init__(self) -> None:
        folder = resources.files(__package__) / "static"
        self._files = {entry.name: entry.read_bytes() for entry in folder.iterdir()
                       if entry.is_file() and _suffix(entry.name) in MEDIA_TYPES}

    def response(self, name: str, suffix: str | None = None) -> Response:
        """The file `name`; with `suffix`, only if its name ends so (each route serves one media type)."""
        body = self._files.get(name)
        if body is None or (suffix is not None and _suffix(name) != suffix):
            raise NotFound(f"no such dashboard file: {name!r}")
        return Response(body, media_type=MEDIA_TYPES[_suffix(name)], headers=SECURITY_HEADERS)


def _suffix(name: str) -> str:
    return "." + name.rpartition(".")[2]
