"""Request ids: taken from ``X-Request-Id`` or made up, set for logging, echoed in the response.

Made-up ids are a random per-process prefix and a counter (cheaper than a UUID per request, and
still unique across replicas). The data plane sets ids itself on its hot routes; everything else
goes through :class:`RequestIdMiddleware`, a plain ASGI middleware that never buffers a body.
"""

from __future__ import annotations

import itertools
import re
import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpugate.logs import request_id

_VALID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")
HEADER = b"x-request-id"


class RequestIds:
    """Accepts a client's id when it is sane, or makes one up."""

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(6)
        self._counter = itertools.count(1)

    def choose(self, offered: bytes | None) -> bytes:
        if offered is not None and _VALID.match(offered):
            return offered
        return f"{self._prefix}{next(self._counter):08x}".encode()

    def __repr__(self) -> str:
        return f"<RequestIds prefix={self._prefix}>"


class RequestIdMiddleware:
    """Give every HTTP request an id and put it on the response as ``x-request-id``."""

    def __init__(self, app: ASGIApp, ids: RequestIds) -> None:
        self.app = app
        self.ids = ids

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        offered = next((v for k, v in scope["headers"] if k == HEADER), None)
        rid = self.ids.choose(offered)
        token = request_id.set(rid.decode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (HEADER, rid)]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id.reset(token)
