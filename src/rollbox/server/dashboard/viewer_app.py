"""The app `rollbox view` serves on loopback: the trajectory viewer's page over one trajectories file.

The file is named when the app is made and is the only one it reads. Loopback is open to every user of the
machine, so the run's data answers only to a token made for this run, which the page receives in its URL's
fragment (never sent to a server, so never in a log) and sends back as a bearer header.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from rollbox.errors import RollboxError
from rollbox.server.dashboard.assets import SECURITY_HEADERS, Assets
from rollbox.server.responses import error_response

RUN_PATH = "/viewer/api/run"


def create_viewer_app(run: Path, token: str) -> Starlette:
    """Serves the viewer at `/viewer`, its files where the dashboard has them, and `run` to holders of `token`."""
    assets = Assets()
    expected = f"Bearer {token}".encode()

    async def page(request: Request) -> Response:
        return assets.response("viewer.html")

    def static(suffix: str) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            try:
                return assets.response(request.path_params["name"], suffix)
            except RollboxError as error:
                return error_response(error)
        return serve

    async def run_text(request: Request) -> Response:
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            return Response("this run needs the token rollbox view printed", status_code=401, headers=SECURITY_HEADERS)
        return Response(run.read_bytes(), media_type="application/x-ndjson",
                        headers={**SECURITY_HEADERS, "x-run-name": run_name(run)})

    async def home(request: Request) -> Response:
        return RedirectResponse("/viewer")

    return Starlette(routes=[Route("/", home), Route("/viewer", page),
                             Route("/dashboard/static/js/{name}", static(".js")),
                             Route("/dashboard/static/css/{name}", static(".css")),
                             Route(RUN_PATH, run_text)])


def run_name(run: Path) -> str:
    """The run as the page titles it: its directory and file name, in the ASCII a header carries."""
    return f"{run.parent.name}/{run.name}".encode("ascii", "replace").decode()
