"""Request ids: taken from ``X-Request-Id`` or made up, set for logging, echoed in the response.

A plain ASGI middleware (no BaseHTTPMiddleware): it must not buffer or re-wrap streaming bodies.
"""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpugate.logs import request_id

_VALID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


class RequestIdMiddleware:
    """Give every HTTP request an id and put it on the response as ``x-request-id``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = b""
        for name, value in scope["headers"]:
            if name == b"x-request-id" and _VALID.match(value):
                rid = value
                break
        if not rid:
            rid = uuid.uuid4().hex.encode()
        token = request_id.set(rid.decode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid)]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id.reset(token)
