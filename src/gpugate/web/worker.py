"""The worker routes (DESIGN §3): a push worker drives the job it was pushed.

Each route first learns which push runtime sent the request (:class:`~gpugate.core.push_keys.
PushKeys`): its ``X-Gpugate-Signature`` over the method, path, lease token and body digest with
that runtime's worker-to-gateway key (``push.auth: signed``, the default), or for a
``push.auth: bearer`` runtime its secret as ``Authorization: Bearer``. Then it hands the
runtimes and ``X-Lease-Token`` to :class:`~gpugate.services.runtimes.push_reports.PushReports`,
which decides; the answer to a signed request — errors included — is signed for that request.
The docstrings below the ``---`` are the routes' OpenAPI (``GET /openapi.json``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive

from gpugate.errors import GpugateError
from gpugate.push_signature import HEADER
from gpugate.services.runtimes.push_reports import Failure, PushReports, Report
from gpugate.web.bodies import json_body, read_body
from gpugate.web.errors import error_response
from gpugate.wiring import Gateway

LEASE_HEADER = "x-lease-token"

_Use = Callable[[PushReports, str, frozenset[str], str | None, Request], Awaitable[dict[str, Any]]]


_ERRORS = """
        "400": {description: "BAD_REQUEST: no X-Lease-Token, or a malformed body"}
        "401": {description: "UNAUTHORIZED: no push runtime's signature (or secret), or a replay"}
        "403": {description: "WRONG_RUNTIME: the job is leased to another runtime"}
        "404": {description: "JOB_NOT_FOUND"}
        "409": {description: "LEASE_TOKEN_STALE: the token is not the lease's; drop the call"}"""


def _reports(request: Request) -> PushReports:
    gateway: Gateway = request.app.state.gateway
    return gateway.push_reports


def _replay(raw: bytes) -> Receive:
    """A ``receive`` that hands over ``raw`` once: the body, read before authentication,
    for the route to parse as it always does."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    return receive


def _worker_route(use: _Use) -> Callable[[Request], Awaitable[Response]]:
    """Authenticate the sender, then run ``use`` with the job, the runtimes and the token; sign
    the answer to a signed request."""

    async def endpoint(request: Request) -> Response:
        reports = _reports(request)
        gateway: Gateway = request.app.state.gateway
        raw = await read_body(request, gateway.config.server.max_body_bytes)
        token = request.headers.get(LEASE_HEADER)
        target = request.scope.get("raw_path", request.url.path.encode()).decode("latin-1")
        query = request.scope.get("query_string", b"")
        runtimes, nonce = gateway.push_keys.authenticate(
            request.headers.get(HEADER),
            request.headers.get("authorization"),
            method=request.method,
            target=target + (f"?{query.decode('latin-1')}" if query else ""),
            body=raw,
            lease_token=token,
            now=time.time(),
        )
        replayed = Request(request.scope, _replay(raw))
        try:
            answer: Response = JSONResponse(
                await use(reports, request.path_params["slug"], runtimes, token, replayed)
            )
        except GpugateError as exc:
            if nonce is None:
                raise
            answer = error_response(exc)
        if nonce is not None:
            answer.headers[HEADER] = gateway.push_keys.sign_answer(
                runtimes, nonce, answer.status_code, bytes(answer.body)
            )
        return answer

    endpoint.__name__ = use.__name__
    endpoint.__doc__ = (use.__doc__ or "").rstrip() + _ERRORS
    return endpoint


async def claimed(
    reports: PushReports, slug: str, runtimes: frozenset[str], token: str | None, _: Request
) -> dict[str, Any]:
    """
    summary: A push worker started the call; the job is running.
    description: >
      Signed with X-Gpugate-Signature by the runtime holding the lease (docs/security.md; a
      push.auth bearer runtime sends Authorization Bearer <secret> instead), X-Lease-Token the
      lease_token the call was pushed with. Repeating it changes nothing. The answer (signed for
      the request) has lease_s, how long the lease lasts from each extension: extend every
      third of it.
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
