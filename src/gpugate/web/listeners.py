"""``admin_listen``: the operator plane on a listener of its own (issue #15 finding 7).

With ``admin_listen`` set, one server serves two sockets; :class:`ListenerSplit` tells a
request's listener by the local port it arrived on (the config requires the two ports to
differ) and answers ``404 NOT_FOUND`` for ``/admin`` and ``/console`` on the main listener, and
for everything else on the admin one. So the data plane's port (exposed to clients, serving
proxied content) never serves the console, and the admin port can stay on a private network.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

ADMIN_PREFIXES = ("/admin/", "/console/")
ADMIN_PATHS = frozenset({"/admin", "/console"})
_NOT_HERE = json.dumps(
    {
        "error": {
            "message": "not served on this listener (admin_listen separates the admin plane)",
            "type": "invalid_request_error",
            "code": "NOT_FOUND",
        }
    }
).encode()


def is_admin_path(path: str) -> bool:
    """Whether ``path`` belongs to the operator plane (the admin API or the console)."""
    return path in ADMIN_PATHS or path.startswith(ADMIN_PREFIXES)


class ListenerSplit:
    """Serves the admin plane only on ``admin_port`` and everything else only elsewhere."""

    def __init__(self, app: ASGIApp, admin_port: int) -> None:
        self.app = app
        self.admin_port = admin_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            server = scope.get("server")
            on_admin = server is not None and server[1] == self.admin_port
            if on_admin != is_admin_path(scope["path"]):
                await _not_here(scope, send)
                return
        await self.app(scope, receive, send)

    def __repr__(self) -> str:
        return f"<ListenerSplit admin_port={self.admin_port}>"


async def _not_here(scope: Scope, send: Send) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(_NOT_HERE))]
    await send({"type": "http.response.start", "status": 404, "headers": headers})
    await send({"type": "http.response.body", "body": _NOT_HERE})
