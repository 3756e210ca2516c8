"""The worker routes (DESIGN §3): a push worker drives the job it was pushed.

Each route reads ``Authorization: Bearer <runtime secret>`` and ``X-Lease-Token`` and hands
them to :class:`~gpugate.services.runtimes.push_reports.PushReports`, which decides. The
docstrings below the ``---`` are the routes' OpenAPI (``GET /openapi.json``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpugate.errors import Unauthorized
from gpugate.services.runtimes.push_reports import Failure, PushReports, Report
from gpugate.web.bodies import json_body
from gpugate.wiring import Gateway

LEASE_HEADER = "x-lease-token"

_Use = Callable[[PushReports, str, frozenset[str], str | None, Request], Awaitable[dict[str, Any]]]


_ERRORS = """
        "400": {description: "BAD_REQUEST: no X-Lease-Token, or a malformed body"}
        "401": {description: "UNAUTHORIZED: no secret, or not that of any push runtime"}
        "403": {description: "WRONG_RUNTIME: the job is leased to another runtime"}
        "404": {description: "JOB_NOT_FOUND"}
        "409": {description: "LEASE_TOKEN_STALE: the token is not the lease's; drop the call"}"""


def _reports(request: Request) -> PushReports:
    gateway: Gateway = request.app.state.gateway
    if gateway.push_reports is None:
        raise Unauthorized("no push runtime is configured: there is no worker to report")
    return gateway.push_reports


def _worker_route(use: _Use) -> Callable[[Request], Awaitable[Response]]:
    """Authenticate the secret, then run ``use`` with the job, the runtimes and the token."""

    async def endpoint(request: Request) -> Response:
        reports = _reports(request)
        runtimes = reports.authenticate(request.headers.get("authorization"))
        token = request.headers.get(LEASE_HEADER)
        answer = await use(reports, request.path_params["slug"], runtimes, token, request)
        return JSONResponse(answer)

    endpoint.__name__ = use.__name__
    endpoint.__doc__ = (use.__doc__ or "").rstrip() + _ERRORS
    return endpoint


async def claimed(
    reports: PushReports, slug: str, runtimes: frozenset[str], token: str | None, _: Request
) -> dict[str, Any]:
    """
    summary: A push worker started the call; the job is running.
    description: >
      Authorization is Bearer <the secret of the runtime holding the lease>, X-Lease-Token the
      lease_token the call was pushed with. Repeating it changes nothing. The answer's lease_s
      is how long the lease lasts from each extension: extend every third of it.
    tags: [worker]
    responses:
        "200": {description: "{slug, state: running, lease_s}"}
    """
    return await reports.claimed(slug, runtimes, token)


async def lease(
    reports: PushReports, slug: str, runtimes: frozenset[str], token: str | None, _: Request
) -> dict[str, Any]:
    """
    summary: Extend the call's lease by jobs.quiet_s from now.
    description: >
      A call whose lease runs out is asked about by the reaper (GET push.url/{call_id}).
    tags: [worker]
    responses:
        "200": {description: "{slug, state, lease_expires_at, lease_s}"}
    """
    return await reports.extend(slug, runtimes, token)


async def report(
    reports: PushReports, slug: str, runtimes: frozenset[str], token: str | None, request: Request
) -> dict[str, Any]:
    """
    summary: Report progress, or the result (the job completes).
    description: >
      Body {progress?: object, result?: any, cost_cents?: number, duration_s?: number}.
      progress appends a progress event; result completes the job, its cost being cost_cents,
      else duration_s times the runtime's budget.cents_per_second.
    tags: [worker]
    responses:
        "200": {description: "{slug, state} (and cost_cents when completed)"}
    """
    return await reports.report(slug, runtimes, token, Report.parse(await json_body(request)))


async def fail(
    reports: PushReports, slug: str, runtimes: frozenset[str], token: str | None, request: Request
) -> dict[str, Any]:
    """
    summary: The call failed.
    description: >
      Body {error_code: "A-Z0-9_", message: string, retryable: bool}. Retryable: the attempt
      is counted and the job goes back to the queue, to walk on along its chain; otherwise the
      job fails for good with error_code.
    tags: [worker]
    responses:
        "200": {description: "{slug, state: queued | failed}"}
    """
    return await reports.fail(slug, runtimes, token, Failure.parse(await json_body(request)))


routes = [
    Route("/v1/jobs/{slug}/claimed", _worker_route(claimed), methods=["POST"]),
    Route("/v1/jobs/{slug}/lease", _worker_route(lease), methods=["POST"]),
    Route("/v1/jobs/{slug}", _worker_route(report), methods=["PATCH"]),
    Route("/v1/jobs/{slug}/fail", _worker_route(fail), methods=["POST"]),
]
