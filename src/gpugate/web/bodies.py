"""Reading a request body within ``server.max_body_bytes``, and JSON that can never cause a 500.

:func:`json_document` is the one way a JSON body becomes data, on every route (the data plane's
routing fields included): malformed JSON, nesting past
:data:`~gpugate.config.untrusted.MAX_DEPTH`, NaN or ±Infinity (``1e999`` too), and text no
store can hold (a NUL character, a lone UTF-16 surrogate) are a 400 ``BAD_REQUEST`` naming the
key path — the same answer on SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from gpugate.config.paths import format_path
from gpugate.config.untrusted import checked_json, first_problem
from gpugate.errors import BadRequest, PayloadTooLarge

if TYPE_CHECKING:
    from gpugate.config.paths import Finding
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


class ParsedBody(bytes):
    """A request body that carries its JSON document, parsed and checked already: what
    :class:`~gpugate.web.auth.ClientKeys` hands on after reading a keyed request's body, so the
    data plane's :func:`json_document` of the same body does not parse it again (the hardening
    walk is not free on an agent's 7 KB turn). The document lives and dies with the body."""

    doc: Any


def parsed_body(raw: bytes, doc: Any) -> ParsedBody:
    """``raw`` carrying ``doc``, which must be what :func:`json_document` returns for it."""
    body = ParsedBody(raw)
    body.doc = doc
    return body


def json_document(raw: bytes | str) -> Any:
    """``raw`` as JSON data, or :class:`BadRequest` saying what is wrong and where."""
    if type(raw) is ParsedBody:
        return raw.doc
    try:
        data, problem = checked_json(raw)
    except ValueError as exc:  # JSONDecodeError, bad UTF-8, or nesting past the limit
        raise BadRequest(f"the request body is not valid JSON: {exc}") from exc
    if problem is not None:
        raise _refusal(problem, "the request body")
    return data


def refuse_unstorable(data: Any, *, what: str = "the request body") -> None:
    """:class:`BadRequest` naming the first value of ``data`` no store can hold (NUL, a lone
    surrogate, NaN, nesting past the limit); for form fields and parameters too."""
    problem = first_problem(data)
    if problem is not None:
        raise _refusal(problem, what)


def _refusal(problem: Finding, what: str) -> BadRequest:
    return BadRequest(f"{format_path(problem.path) or what}: {problem.message}")


async def json_body(request: Request, *, empty_ok: bool = False) -> dict[str, Any]:
    """The body as a JSON object, within ``server.max_body_bytes``; :class:`BadRequest` if it is
    not one. ``empty_ok``: an empty (or blank) body is ``{}``."""
    gateway: Gateway = request.app.state.gateway
    raw = await read_body(request, gateway.config.server.max_body_bytes)
    if empty_ok and not raw.strip():
        return {}
    body = json_document(raw)
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body
