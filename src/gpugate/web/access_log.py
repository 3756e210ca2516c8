"""One access-log line per HTTP request, at INFO on the ``gpugate.access`` logger.

``POST /v1/chat/completions 200 12.4ms upstream=qwen-35b model=qwen-35b attempts=2``
what was asked, what was answered and how long it took, written when the response ends (a
stream's line comes at its end, with its whole duration). The data plane's own facts ride on the
response headers it sets (``X-Gateway-Upstream``, ``X-Gateway-Model``, ``X-Gateway-Attempts``),
so this middleware reads them there and no route has to know about logging; the line carries
the request's id like every other line. In JSON format the
same facts are fields (``method``, ``path``, ``status``, ``duration_ms``, ...).

The path is logged without its query string (a query may carry what a log should not keep).
Probes and scrapes (``/healthz``, ``/readyz``, ``/metrics``) are logged at DEBUG. A request the
client left before any answer is logged with status ``-``. ``server.access_log: false`` (or
``gpugate serve --no-access-log``) turns the lines off; so does the logger's level.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpugate.logs import request_id

log = logging.getLogger("gpugate.access")

_QUIET = frozenset({"/healthz", "/readyz", "/metrics"})
#: Response headers whose values the line carries, and the field each becomes.
_FIELDS = (
    (b"x-gateway-upstream", "upstream"),
    (b"x-gateway-model", "model"),
    (b"x-gateway-attempts", "attempts"),
)
_NAMES = dict(_FIELDS)


class AccessLog:
    """ASGI middleware writing the access log (outermost, so it times the whole request)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        level = logging.DEBUG if scope["path"] in _QUIET else logging.INFO
        if not log.isEnabledFor(level):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        answered: list[Message] = []

        async def noting(message: Message) -> None:
            if message["type"] == "http.response.start":
                answered.append(message)
            await send(message)

        try:
            await self.app(scope, receive, noting)
        finally:
            _write(level, scope, answered[0] if answered else None, started)


def _write(level: int, scope: Scope, start: Message | None, started: float) -> None:
    status = start["status"] if start is not None else "-"
    headers = start.get("headers", ()) if start is not None else ()
    write(level, scope["method"], scope["path"], status, headers, started)


def write(
    level: int,
    method: str,
    path: str,
    status: int | str,
    headers: Iterable[tuple[bytes, bytes]],
    started: float,
) -> None:
    """One line: ``status`` and ``headers`` as answered (``"-"``, none: the client left first),
    ``started`` the request's :func:`time.perf_counter`. The fast path writes its lines here."""
    duration_ms = round((time.perf_counter() - started) * 1000, 1)
    facts: dict[str, str] = {}
    rid = None
    for name, value in headers:
        key = name.lower()
        if key == b"x-request-id":
            rid = value.decode("latin-1")
        elif (field := _NAMES.get(key)) is not None:
            facts[field] = value.decode("latin-1")
    tail = "".join(f" {field}={facts[field]}" for _, field in _FIELDS if field in facts)
    extra: dict[str, object] = {
        "method": method, "path": path, "status": status, "duration_ms": duration_ms,
    }  # fmt: skip
    extra["request_id"] = rid
    token = request_id.set(rid)  # the request's id on its line, as on every other
    try:
        log.log(
            level, "%s %s %s %.1fms%s", method, path, status, duration_ms, tail,
            extra=extra | facts,
        )  # fmt: skip
    finally:
        request_id.reset(token)
