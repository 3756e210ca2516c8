"""The worker routes (DESIGN §3): a push worker drives the job it was pushed.

Each route is an operation of ``Security.WORKER`` (:func:`gpugate.web.api.operation`): it
first learns which push runtime sent the request — its ``X-Gpugate-Signature`` over the method,
path, lease token and body digest with that runtime's worker-to-gateway key (``push.auth:
signed``, the default), or for a ``push.auth: bearer`` runtime its secret as ``Authorization:
Bearer`` — then validates the body (:mod:`gpugate.web.schemas.worker`) and hands the runtimes
and ``X-Lease-Token`` to :class:`~gpugate.services.runtimes.push_reports.PushReports`, which
decides; the answer to a signed request — errors included — is signed for that request.
"""

from __future__ import annotations

from functools import partial

from gpugate.services.runtimes.push_reports import PushReports
from gpugate.web.api import Caller, operation, route
from gpugate.web.schemas.operation import Answer, Security
from gpugate.web.schemas.worker import (
    WORKER_ERRORS,
    FailureBody,
    ReportBody,
    WorkerAnswer,
    WorkerHeaders,
    WorkerPath,
)
from gpugate.wiring import Gateway

worker = partial(  # every operation here
    operation,
    Security.WORKER,
    tags=("worker",),
    responses={200: Answer("the job's state now", WorkerAnswer)},
    errors=WORKER_ERRORS,
)


def _reports(gateway: Gateway) -> PushReports:
    return gateway.push_reports


@worker()
async def claimed(
    gateway: Gateway, caller: Caller, path: WorkerPath, headers: WorkerHeaders
) -> WorkerAnswer:
    """A push worker started the call; the job is running.

    Signed with X-Gpugate-Signature by the runtime holding the lease (docs/security.md; a
    push.auth bearer runtime sends Authorization Bearer <secret> instead), X-Lease-Token the
    lease_token the call was pushed with. Repeating it changes nothing. The answer (signed for
    the request) has lease_s, how long the lease lasts from each extension: extend every third
    of it.
    """
    answer = await _reports(gateway).claimed(path.slug, caller.runtimes, headers.lease_token)
    return WorkerAnswer.of(answer)


@worker()
async def lease(
    gateway: Gateway, caller: Caller, path: WorkerPath, headers: WorkerHeaders
) -> WorkerAnswer:
    """Extend the call's lease by jobs.quiet_s from now.

    A call whose lease runs out is asked about by the reaper (GET push.url/{call_id}).
    """
    answer = await _reports(gateway).extend(path.slug, caller.runtimes, headers.lease_token)
    return WorkerAnswer.of(answer)


@worker()
async def report(
    gateway: Gateway, caller: Caller, path: WorkerPath, headers: WorkerHeaders, body: ReportBody
) -> WorkerAnswer:
    """Report progress, or the result (the job completes).

    progress appends a progress event; result completes the job, its cost being cost_cents,
    else duration_s times the runtime's budget.cents_per_second.
    """
    answer = await _reports(gateway).report(
        path.slug, caller.runtimes, headers.lease_token, body.report()
    )
    return WorkerAnswer.of(answer)


@worker()
async def fail(
    gateway: Gateway, caller: Caller, path: WorkerPath, headers: WorkerHeaders, body: FailureBody
) -> WorkerAnswer:
    """The call failed.

    Retryable: the attempt is counted and the job goes back to the queue, to walk on along its
    chain; otherwise the job fails for good with error_code.
    """
    answer = await _reports(gateway).fail(
        path.slug, caller.runtimes, headers.lease_token, body.failure()
    )
    return WorkerAnswer.of(answer)


routes = [
    route("/v1/jobs/{slug}/claimed", claimed, "POST"),
    route("/v1/jobs/{slug}/lease", lease, "POST"),
    route("/v1/jobs/{slug}", report, "PATCH"),
    route("/v1/jobs/{slug}/fail", fail, "POST"),
]
