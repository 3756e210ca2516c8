"""Reading a request body within ``server.max_body_bytes``, for the JSON API routes."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from gpugate.errors import BadRequest, PayloadTooLarge

if TYPE_CHECKING:
    from gpugate.wiring import Gateway


def refuse_declared_over(request: Request, limit: int) -> None:
    """:class:`PayloadTooLarge` if the request's Content-Length is over ``limit``, before any of
    the body is read (a body without one is checked as it is read)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds max_body_bytes ({limit})")


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body; :class:`PayloadTooLarge` as soon as it (or its declared length) is over."""
    refuse_declared_over(request, limit)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise PayloadTooLarge(f"request body exceeds max_body_bytes ({limit})")
    return bytes(raw)


async def json_body(request: Request, *, empty_ok: bool = False) -> dict[str, Any]:
    """The body as a JSON object, within ``server.max_body_bytes``; :class:`BadRequest` if it is
    not one. ``empty_ok``: an empty (or blank) body is ``{}``."""
    gateway: Gateway = request.app.state.gateway
    raw = await read_body(request, gateway.config.server.max_body_bytes)
    if empty_ok and not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body
