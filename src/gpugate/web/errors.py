"""The one table from gpugate's errors to HTTP, and the OpenAI-shaped error body.

Lookup walks the exception's MRO, so a new subclass inherits its parent's status until it earns
its own row (Starlette's exception handlers work the same way).
"""

from __future__ import annotations

import json
import logging
import math
from typing import TypeVar

from starlette.exceptions import HTTPException
from starlette.responses import Response

from gpugate import errors

T = TypeVar("T")

log = logging.getLogger("gpugate.web")

STATUS: dict[type[errors.GpugateError], int] = {
    errors.GpugateError: 500,
    errors.StoreError: 503,
    errors.ConfigError: 422,
    errors.ClientError: 400,
    errors.BadRequest: 400,
    errors.PayloadTooLarge: 413,
    errors.NoSuchRoute: 404,
    errors.MethodNotAllowed: 405,
    errors.Unauthorized: 401,
    errors.CsrfRejected: 403,
    errors.ModelNotAllowed: 403,
    errors.RunnerNotAllowed: 403,
    errors.KeyNotFound: 404,
    errors.KeyRevoked: 409,
    errors.KeyLimited: 429,
    errors.TooManyAttempts: 429,
    errors.UnknownModel: 404,
    errors.UnknownUpstream: 404,
    errors.JobNotFound: 404,
    errors.JobNotCompleted: 409,
    errors.FileNotFound: 404,
    errors.BatchNotFound: 404,
    errors.UnknownRuntime: 404,
    errors.UnknownGpu: 404,
    errors.UnknownConfigVersion: 404,
    errors.WrongRuntime: 403,
    errors.LeaseTokenStale: 409,
    errors.ExternalUpstreamForbidden: 403,
    errors.RawForbidden: 403,
    errors.HeadersTooLarge: 431,
    errors.RequestTimeout: 408,
    errors.IdempotencyConflict: 409,
    errors.IdempotencyKeyReused: 422,
    errors.Refused: 503,
    errors.GpuSaturated: 429,
    errors.QueueTimeout: 503,
    errors.QueueFull: 503,
    errors.NoHealthyUpstream: 503,
    errors.UpstreamError: 502,
    errors.UpstreamTimeout: 504,
    errors.UpstreamUnreachable: 502,
}

# OpenAI's `type` field: what kind of problem, for clients that branch on it.
_TYPES: dict[type[errors.GpugateError], str] = {
    errors.GpugateError: "server_error",
    errors.ClientError: "invalid_request_error",
    errors.Unauthorized: "authentication_error",
    errors.Refused: "overloaded_error",
    errors.GpuSaturated: "rate_limit_error",
    errors.KeyLimited: "rate_limit_error",
    errors.UpstreamError: "upstream_error",
}


def _lookup(table: dict[type[errors.GpugateError], T], exc: errors.GpugateError) -> T:
    for cls in type(exc).__mro__:
        if cls in table:
            return table[cls]
    return table[errors.GpugateError]


def status_of(exc: errors.GpugateError) -> int:
    """The HTTP status for an error of ours."""
    return _lookup(STATUS, exc)


def error_body(exc: errors.GpugateError) -> bytes:
    """``{"error": {"message", "type", "code"}}`` as OpenAI clients expect it; an internal
    error's own message goes to the log, the client reads its public one."""
    if exc.internal:
        log.warning("%s (answered as %r): %s", exc.code, exc.public_message, exc.message)
    message = exc.public_message
    body = {"error": {"message": message, "type": _lookup(_TYPES, exc), "code": exc.code}}
    return json.dumps(body).encode()


def error_headers(exc: errors.GpugateError) -> dict[str, str]:
    """Retry-After (whole seconds, at least 1) on refusals and when the error carries one."""
    status = status_of(exc)
    if exc.retry_after_s is None and status not in (429, 503):
        return {}
    seconds = max(1, math.ceil(exc.retry_after_s if exc.retry_after_s is not None else 1))
    return {"retry-after": str(seconds)}


def from_http_exception(exc: HTTPException) -> errors.GpugateError:
    """Starlette's own refusals (no such route, a wrong method, a broken form) as our errors, so
    that every error a client sees has the one JSON shape."""
    kinds: dict[int, type[errors.GpugateError]] = {
        404: errors.NoSuchRoute,
        405: errors.MethodNotAllowed,
        413: errors.PayloadTooLarge,
    }
    return kinds.get(exc.status_code, errors.BadRequest)(exc.detail)


def error_response(exc: errors.GpugateError) -> Response:
    """The whole HTTP response for an error of ours."""
    return Response(
        error_body(exc),
        status_code=status_of(exc),
        headers=error_headers(exc),
        media_type="application/json",
    )
