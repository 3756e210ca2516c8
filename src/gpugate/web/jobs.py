"""The jobs API (DESIGN §3): create with ``Idempotency-Key``, read, list, events, cancel, retry."""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import Response

from gpugate.services.job_quota import charged
from gpugate.services.jobs import Jobs, event_view, job_view
from gpugate.web.api import operation, route
from gpugate.web.auth import keyed_job, principal_of, tenant_of
from gpugate.web.schemas.jobs import (
    JobCreate,
    JobCreateHeaders,
    JobCreateQuery,
    JobEventList,
    JobEventView,
    JobList,
    JobListQuery,
    JobPath,
    JobView,
)
from gpugate.web.schemas.operation import Answer, Security
from gpugate.web.sync_jobs import CACHE_HEADER, create_and_wait
from gpugate.wiring import Gateway

TAGS = ("jobs",)
client = partial(operation, Security.CLIENT, tags=TAGS)  # every operation here
NOT_FOUND = {404: "JOB_NOT_FOUND"}


def _jobs(gateway: Gateway) -> Jobs:
    return gateway.jobs


def _job(view: JobView, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(view.to_bytes(), status, headers, media_type="application/json")


@client(
    responses={
        202: Answer("the new job, queued (or still running after `wait`)", JobView),
        200: Answer(
            "the job this Idempotency-Key made before; with `wait`: the finished job",
            JobView,
            headers={CACHE_HEADER: "with `wait`, for a model whose results are cached: hit|miss"},
        ),
    },
    errors={
        403: "MODEL_NOT_ALLOWED, RUNNER_NOT_ALLOWED: the client key may not use it",
        404: "UNKNOWN_MODEL: no runtime serves the model",
        422: "IDEMPOTENCY_KEY_REUSED: the same Idempotency-Key made a job of another body",
        429: "RATE_LIMITED, TOKEN_LIMITED, CONCURRENCY_LIMITED, BUDGET_EXCEEDED: the client key "
        "is over a limit "
        "(a job is charged its estimate when it is made); GPU_SATURATED: with `wait`, a batch "
        "job whose every upstream is saturated",
    },
)
async def create_job(
    request: Request,
    gateway: Gateway,
    query: JobCreateQuery,
    headers: JobCreateHeaders,
    body: JobCreate,
) -> Response:
    """Create a job: 202 with the new job, 200 with the existing one for a known Idempotency-Key.

    The job is stored and the dispatcher woken at once; it runs along its runner, then the
    fallback chain. With `?wait=SECONDS` (0-300) the answer waits for it: 200 with the finished
    job, 202 if it is still running (see the README's synchronous front).
    """
    job_request, key = keyed_job(request, gateway, body.job_request()), headers.idempotency_key
    principal = principal_of(request)
    if query.wait is not None:
        return await create_and_wait(
            gateway, job_request, key, query.wait, headers.cache_control, principal
        )
    jobs = _jobs(gateway)
    job, created = await charged(
        gateway.quota,
        principal,
        job_request,
        lambda: jobs.create(job_request, idempotency_key=key),
        lambda: jobs.made_before(job_request, idempotency_key=key),
    )
    return _job(JobView.of(job_view(job)), 202 if created else 200)


@client(
    responses={200: Answer("the job, with its input", JobView)},
    errors=NOT_FOUND,
)
async def get_job(request: Request, gateway: Gateway, path: JobPath) -> JobView:
    """A job: its state, attempts, lease, result or error, and its input."""
    return JobView.of(
        job_view(await _jobs(gateway).get(path.slug, tenant=tenant_of(request)), with_input=True)
    )


@client(responses={200: Answer("a page, newest first", JobList)})
async def list_jobs(request: Request, gateway: Gateway, query: JobListQuery) -> JobList:
    """Jobs, newest first, filtered by `state` and `runner`; `cursor` pages on."""
    page = await _jobs(gateway).list(
        state=query.state,
        runner=query.runner,
        limit=query.limit,
        cursor=query.cursor,
        tenant=tenant_of(request),
    )
    views = [JobView.of(job_view(job)) for job in page.jobs]
    return JobList(data=views, next_cursor=page.next_cursor)


@client(
    responses={200: Answer("the result as JSON", media="application/json", schema={})},
    errors={**NOT_FOUND, 409: "JOB_NOT_COMPLETED"},
)
async def job_result(request: Request, gateway: Gateway, path: JobPath) -> Response:
    """A completed job's result, inline or from the blob store.

    The JSON result, however large (a result over blobs.inline_max_bytes is not in the job's
    view, only its result_ref).
    """
    job = await _jobs(gateway).get(path.slug, tenant=tenant_of(request))
    body = await gateway.results.read(job)
    return Response(body, media_type="application/json")


@client(
    responses={200: Answer("every event, oldest first", JobEventList)},
    errors=NOT_FOUND,
)
async def job_events(request: Request, gateway: Gateway, path: JobPath) -> JobEventList:
    """A job's events: every state change, with its runtime, call and error code."""
    events = await _jobs(gateway).events(path.slug, tenant=tenant_of(request))
    return JobEventList(data=[JobEventView.of(event_view(event)) for event in events])


@client(
    responses={200: Answer("the job", JobView)},
    errors=NOT_FOUND,
)
async def cancel_job(request: Request, gateway: Gateway, path: JobPath) -> JobView:
    """Cancel a job: queued → cancelled; running → the runtime's cancel first, then cancelled."""
    return JobView.of(
        job_view(await _jobs(gateway).cancel(path.slug, actor="api", tenant=tenant_of(request)))
    )


@client(
    responses={200: Answer("the job", JobView)},
    errors=NOT_FOUND,
)
async def retry_job(request: Request, gateway: Gateway, path: JobPath) -> JobView:
    """Re-drive a failed job from the start of its chain (any other job is left as it is)."""
    return JobView.of(
        job_view(await _jobs(gateway).retry(path.slug, actor="api", tenant=tenant_of(request)))
    )


routes = [
    route("/v1/jobs", create_job, "POST"),
    route("/v1/jobs", list_jobs, "GET"),
    route("/v1/jobs/{slug}", get_job, "GET"),
    route("/v1/jobs/{slug}/events", job_events, "GET"),
    route("/v1/jobs/{slug}/result", job_result, "GET"),
    route("/v1/jobs/{slug}/cancel", cancel_job, "POST"),
    route("/v1/jobs/{slug}/retry", retry_job, "POST"),
]
