"""``admin_listen``: the operator plane on a listener of its own (issue #15 finding 7).

With ``admin_listen`` set, one server serves two sockets; :class:`ListenerSplit` tells a
request's listener by the local port it arrived on (the config requires the two ports to
differ) and answers ``404 NOT_FOUND`` for ``/admin`` and ``/console`` on the main listener, and
for everything else on the admin one. So the data plane's port (exposed to clients, serving
proxied content) never serves the console, and the admin port can stay on a private network.

With ``serve --workers N`` (:mod:`gpugate.workers`) every worker also listens on a private unix
socket (:func:`sibling_metrics`) where it answers a snapshot of its metrics, so the worker that
gets a ``/metrics`` scrape can merge its siblings' into one view.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from gpugate.metrics import Metrics

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


# --- the workers of `serve --workers N`: each serves its registry to its siblings -----------

SNAPSHOT_TIMEOUT_S = 1.0
"""A sibling that has not sent its snapshot within this is left out of the scrape (restarting,
or stuck): the scrape still answers, and ``gateway_workers_reporting`` says how many did."""


@dataclass(frozen=True, slots=True)
class Peers:
    """One worker's view of ``serve --workers N``: its index and every worker's private socket.

    The sockets are in a directory of the supervisor's only its user may enter (mode 0700): a
    snapshot is what ``/metrics`` serves anyway, but nobody else reaches it this way."""

    index: int
    paths: tuple[str, ...]
    restarts_path: str
    takes_over: bool = False
    """The first worker of a fresh start: the leases a SQLite store holds are a previous run's,
    its to take back (every other worker starts beside live siblings)."""

    @property
    def own(self) -> str:
        return self.paths[self.index]

    @property
    def siblings(self) -> tuple[str, ...]:
        return tuple(path for i, path in enumerate(self.paths) if i != self.index)

    def remove_own(self) -> None:
        Path(self.own).unlink(missing_ok=True)

    def restarts(self) -> int:
        """Workers the supervisor restarted so far (its file; 0 while it has none)."""
        try:
            return int(Path(self.restarts_path).read_text(encoding="ascii") or 0)
        except (OSError, ValueError):
            return 0


@contextlib.asynccontextmanager
async def sibling_metrics(metrics: Metrics, peers: Peers | None) -> AsyncIterator[None]:
    """With ``peers``: serve this worker's snapshot on its private socket, and make its
    ``/metrics`` the merge of every worker's (:meth:`Metrics.exposition`); else nothing."""
    if peers is None:
        yield
        return

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        del reader  # connecting is the question
        try:
            writer.write(metrics.snapshot())
            await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    peers.remove_own()  # a predecessor's, killed before it could remove it
    server = await asyncio.start_unix_server(answer, path=peers.own)

    async def siblings() -> list[bytes]:
        answers = await asyncio.gather(*(_snapshot(path) for path in peers.siblings))
        return [answer for answer in answers if answer is not None]

    metrics.join_workers(len(peers.paths), siblings, peers.restarts)
    try:
        yield
    finally:
        server.close()
        peers.remove_own()


async def _snapshot(path: str) -> bytes | None:
    """A sibling's snapshot, or None when it does not answer in time (it is restarting)."""
    try:
        async with asyncio.timeout(SNAPSHOT_TIMEOUT_S):
            reader, writer = await asyncio.open_unix_connection(path, limit=1 << 20)
            try:
                return await reader.read(-1)
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return None
