"""``POST /v1/jobs?wait=SECONDS``: the synchronous job front (:mod:`gpugate.services.sync_front`).

Reached from ``POST /v1/jobs`` when the query has ``wait``: a number of seconds, 0 or more
(more than 300 is taken as 300); ``Cache-Control: no-cache`` skips the result cache; the answer
carries ``X-Gateway-Cache: hit|miss`` for a model whose results are cached.
"""

from __future__ import annotations

from starlette.responses import Response

from gpugate.core.keys import Principal
from gpugate.services.job_quota import charged
from gpugate.services.jobs import JobRequest
from gpugate.services.sync_front import MAX_WAIT_S, SyncAnswer
from gpugate.web.schemas.jobs import JobView
from gpugate.wiring import Gateway

CACHE_HEADER = "X-Gateway-Cache"


def no_cache(cache_control: str | None) -> bool:
    directives = (cache_control or "").lower().replace(" ", "").split(",")
    return "no-cache" in directives or "no-store" in directives


async def create_and_wait(
    gateway: Gateway,
    job_request: JobRequest,
    key: str | None,
    wait_s: float,
    cache_control: str | None,
    principal: Principal | None = None,
) -> Response:
    """200 with the finished (or cached) job, 202 with the job still running after ``wait``;
    a job it makes is charged to ``principal``'s limits (:mod:`gpugate.services.job_quota`)."""

    async def create() -> tuple[SyncAnswer, bool]:
        answer = await gateway.sync_front.create(
            job_request,
            idempotency_key=key,
            wait_s=min(wait_s, MAX_WAIT_S),
            use_cache=not no_cache(cache_control),
        )
        return answer, answer.made

    answer, _ = await charged(
        gateway.quota,
        principal,
        job_request,
        create,
        lambda: gateway.jobs.made_before(job_request, idempotency_key=key),
    )
    headers = {} if answer.cache is None else {CACHE_HEADER: answer.cache}
    view = JobView.of(answer.view)
    return Response(view.to_bytes(), answer.status, headers, media_type="application/json")
