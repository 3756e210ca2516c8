"""The jobs API (DESIGN §3): create with ``Idempotency-Key``, read, list, events, cancel, retry."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpugate.errors import BadRequest
from gpugate.services.jobs import Jobs, event_view, job_view, parse_job_request
from gpugate.web.bodies import json_body
from gpugate.web.sync_jobs import create_and_wait
from gpugate.wiring import Gateway

MAX_LIST = 500


def _jobs(request: Request) -> Jobs:
    gateway: Gateway = request.app.state.gateway
    assert gateway.jobs is not None
    return gateway.jobs


async def create_job(request: Request) -> Response:
    """202 with the new job; 200 with the existing one when the Idempotency-Key was seen."""
    job_request = parse_job_request(await json_body(request))
    key = request.headers.get("idempotency-key")
    if "wait" in request.query_params:  # the synchronous front (issue 9)
        return await create_and_wait(request, job_request, key)
    job, created = await _jobs(request).create(job_request, idempotency_key=key)
    return JSONResponse(job_view(job), status_code=202 if created else 200)


async def get_job(request: Request) -> Response:
    job = await _jobs(request).get(request.path_params["slug"])
    return JSONResponse(job_view(job, with_input=True))


async def list_jobs(request: Request) -> Response:
    q = request.query_params
    raw_limit = q.get("limit", "50")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIST:
        raise BadRequest(f"limit must be 1 to {MAX_LIST}")
    page = await _jobs(request).list(
        state=q.get("state"), runner=q.get("runner"), limit=int(raw_limit), cursor=q.get("cursor")
    )
    return JSONResponse(
        {"data": [job_view(job) for job in page.jobs], "next_cursor": page.next_cursor}
    )


async def job_result(request: Request) -> Response:
    """---
    summary: A completed job's result, inline or from the blob store
    description: The JSON result, however large (a result over blobs.inline_max_bytes is not
      in the job's view, only its result_ref). 409 JOB_NOT_COMPLETED before it completes.
    responses:
      200: {description: the result as JSON}
      404: {description: JOB_NOT_FOUND}
      409: {description: JOB_NOT_COMPLETED}
    """
    gateway: Gateway = request.app.state.gateway
    assert gateway.results is not None
    job = await _jobs(request).get(request.path_params["slug"])
    body = await gateway.results.read(job)
    return Response(body, media_type="application/json")


async def job_events(request: Request) -> Response:
    events = await _jobs(request).events(request.path_params["slug"])
    return JSONResponse({"data": [event_view(event) for event in events]})


async def cancel_job(request: Request) -> Response:
    job = await _jobs(request).cancel(request.path_params["slug"], actor="api")
    return JSONResponse(job_view(job))


async def retry_job(request: Request) -> Response:
    job = await _jobs(request).retry(request.path_params["slug"], actor="api")
    return JSONResponse(job_view(job))


routes = [
    Route("/v1/jobs", create_job, methods=["POST"]),
    Route("/v1/jobs", list_jobs, methods=["GET"]),
    Route("/v1/jobs/{slug}", get_job, methods=["GET"]),
    Route("/v1/jobs/{slug}/events", job_events, methods=["GET"]),
    Route("/v1/jobs/{slug}/result", job_result, methods=["GET"]),
    Route("/v1/jobs/{slug}/cancel", cancel_job, methods=["POST"]),
    Route("/v1/jobs/{slug}/retry", retry_job, methods=["POST"]),
]
