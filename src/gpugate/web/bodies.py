"""Reading a request body within ``server.max_body_bytes``, for the JSON API routes."""

from __future__ import annotations

from starlette.requests import Request

from gpugate.errors import PayloadTooLarge


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
