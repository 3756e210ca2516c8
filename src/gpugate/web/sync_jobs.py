"""``POST /v1/jobs?wait=SECONDS``: the synchronous job front (:mod:`gpugate.services.sync_front`).

Reached from ``POST /v1/jobs`` when the query has ``wait``. ``wait`` is a number of seconds,
0 to 300 (more is taken as 300); ``Cache-Control: no-cache`` skips the result cache; the answer
carries ``X-Gateway-Cache: hit|miss`` for a model whose results are cached.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gpugate.errors import BadRequest
from gpugate.services.jobs import JobRequest
from gpugate.services.sync_front import MAX_WAIT_S, SyncFront
from gpugate.wiring import Gateway


def wait_seconds(raw: str) -> float:
    """The ``wait`` query parameter: seconds, 0 or more (capped at :data:`MAX_WAIT_S`)."""
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise BadRequest(f"wait must be a number of seconds, 0 to {MAX_WAIT_S:g}; got {raw!r}")
    return min(seconds, MAX_WAIT_S)


def no_cache(request: Request) -> bool:
    directives = request.headers.get("cache-control", "").lower().replace(" ", "").split(",")
    return "no-cache" in directives or "no-store" in directives


async def create_and_wait(request: Request, job_request: JobRequest, key: str | None) -> Response:
    """200 with the finished (or cached) job, 202 with the job still running after ``wait``."""
    gateway: Gateway = request.app.state.gateway
    front: SyncFront | None = gateway.sync_front
    assert front is not None
    wait_s = wait_seconds(request.query_params["wait"])
    answer = await front.create(
        job_request, idempotency_key=key, wait_s=wait_s, use_cache=not no_cache(request)
    )
    headers = {} if answer.cache is None else {"x-gateway-cache": answer.cache}
    return JSONResponse(answer.view, status_code=answer.status, headers=headers)
