"""The worker routes' use cases: a push worker drives its job (DESIGN §3, worker routes).

A worker proves two things with every report: **who** it is — the push runtimes whose
signature (or, for ``push.auth: bearer``, secret) the request carries, established by the web
layer with :class:`~gpugate.core.push_keys.PushKeys` — and **which call** it runs —
``X-Lease-Token``, the token the job's lease was given with the call. A report is accepted only
from the runtime holding the job's lease (the call's runtime once it is recorded; the job's
runner while the dispatcher is still submitting it) and only with the current token; anything
else is refused and changes nothing:

* no or an unknown signature or secret → :class:`~gpugate.errors.Unauthorized` (401, PushKeys);
* another runtime's → :class:`~gpugate.errors.WrongRuntime` (403);
* a stale token, or a job no longer leased → :class:`~gpugate.errors.LeaseTokenStale` (409).

The reports: ``claimed`` (``dispatching → running``), ``lease`` (extend by ``jobs.quiet_s``),
``PATCH`` (a ``progress`` event, or the ``result``: completed, with ``cost_cents`` or
``duration_s`` x ``budget.cents_per_second`` as the cost) and ``fail`` (retryable: the attempt
is counted and the job goes back to the queue to walk on; else the job fails for good).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpugate.config import GatewayConfig
from gpugate.errors import (
    BadRequest,
    JobNotFound,
    LeaseTokenStale,
    WrongRuntime,
)
from gpugate.services.results import Results
from gpugate.services.runtimes.push import call_cost
from gpugate.store import JobRecord, JobStore


@dataclass(frozen=True, slots=True)
class Report:
    """A validated ``PATCH /v1/jobs/{slug}`` body."""

    progress: dict[str, Any] | None = None
    has_result: bool = False
    result: Any = None
    cost_cents: float | None = None
    duration_s: float | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """A validated ``POST /v1/jobs/{slug}/fail`` body."""

    error_code: str
    message: str
    retryable: bool


class PushReports:
    """Checks and applies a push worker's reports; see the module docstring.

    ``on_finished`` is called when a report ends the call (completed, failed or back in the
    queue): wiring gives the dispatcher's ``slot_freed``, so a job waiting for capacity runs at
    once.
    """

    def __init__(
        self,
        store: JobStore,
        config: Callable[[], GatewayConfig],
        *,
        on_finished: Callable[[], None] | None = None,
        results: Results | None = None,
    ) -> None:
        self._store = store
        self._results = results or Results()  # Results(): every result inline
        self._config = config
        self._on_finished = on_finished

    async def claimed(
        self, slug: str, runtimes: frozenset[str], token: str | None
    ) -> dict[str, Any]:
        """The worker started the call: the job is ``running``."""
        job, runtime = await self._check(slug, runtimes, token)
        await self._fenced(
            self._store.mark_running(slug, _token(token), actor=_actor(runtime)), job
        )
        return {"slug": slug, "state": "running", "lease_s": self._config().jobs.quiet_s}

    async def extend(
        self, slug: str, runtimes: frozenset[str], token: str | None
    ) -> dict[str, Any]:
        """The worker still runs the call: the lease lasts ``jobs.quiet_s`` from now."""
        job, _ = await self._check(slug, runtimes, token)
        lease_s = self._config().jobs.quiet_s
        until = await self._store.extend_lease(slug, _token(token), lease_s=lease_s)
        if until is None:
            raise _stale(job)
        return {
            "slug": slug,
            "state": job.state,
            "lease_expires_at": until.isoformat(),
            "lease_s": lease_s,
        }

    async def report(
        self, slug: str, runtimes: frozenset[str], token: str | None, report: Report
    ) -> dict[str, Any]:
        """Progress (an event), or the result (the job completes)."""
        job, runtime = await self._check(slug, runtimes, token)
        actor, fenced = _actor(runtime), _token(token)
        if report.progress is not None:
            await self._fenced(
                self._store.record_progress(slug, fenced, report.progress, actor=actor), job
            )
        if not report.has_result:
            return {"slug": slug, "state": job.state}
        cost = call_cost(report.cost_cents, report.duration_s, self._cents_per_second(runtime))
        await self._fenced(
            self._results.complete(
                self._store, slug, fenced, report.result, cost_cents=cost, actor=actor
            ),
            job,
        )
        self._finished()
        return {"slug": slug, "state": "completed", "cost_cents": cost}

    async def fail(
        self, slug: str, runtimes: frozenset[str], token: str | None, failure: Failure
    ) -> dict[str, Any]:
        """Retryable: the attempt counts and the job walks on; else the job fails for good."""
        job, runtime = await self._check(slug, runtimes, token)
        actor, fenced, store = _actor(runtime), _token(token), self._store
        if not failure.retryable:
            await self._fenced(
                store.fail(
                    slug,
                    fenced,
                    error_code=failure.error_code,
                    message=failure.message,
                    actor=actor,
                ),
                job,
            )
            self._finished()
            return {"slug": slug, "state": "failed"}
        await self._fenced(
            store.record_attempt_failure(
                slug,
                fenced,
                runtime=runtime,
                error_code=failure.error_code,
                message=failure.message,
                retryable=True,
                actor=actor,
            ),
            job,
        )
        await self._fenced(
            store.release(slug, fenced, error_code=failure.error_code, actor=actor), job
        )
        self._finished()
        return {"slug": slug, "state": "queued"}

    # -- the checks --------------------------------------------------------------------------

    async def _check(
        self, slug: str, runtimes: frozenset[str], token: str | None
    ) -> tuple[JobRecord, str]:
        """The job and the runtime holding its lease, when ``runtimes`` include it and
        ``token`` is the lease's; else the refusal (nothing is written before this passes)."""
        if not token:
            raise BadRequest("a push worker's report needs the X-Lease-Token header")
        job = await self._store.get_job(slug)
        if job is None:
            raise JobNotFound(f"no job {slug!r}")
        holder = _holder(job)
        if holder is None:
            raise _stale(job)
        if holder not in runtimes:
            raise WrongRuntime(
                f"job {slug!r} is leased to another runtime than the one this secret belongs to"
            )
        if job.lease_token is None or not hmac.compare_digest(
            token.encode(), job.lease_token.encode()
        ):
            raise _stale(job)
        return job, holder

    @staticmethod
    async def _fenced(write: Any, job: JobRecord) -> None:
        if not await write:  # the lease moved between the check and the write
            raise _stale(job)

    def _cents_per_second(self, runtime: str) -> float | None:
        try:
            budget = self._config().runtime(runtime).budget
        except KeyError:
            return None
        return budget.cents_per_second if budget is not None else None

    def _finished(self) -> None:
        if self._on_finished is not None:
            self._on_finished()

    def __repr__(self) -> str:
        return f"<PushReports results={self._results!r}>"


def _holder(job: JobRecord) -> str | None:
    """The runtime holding the job's lease: the call's, or — while the dispatcher submits —
    the runner's; None when the job is not leased."""
    call = job.call
    if call is not None:
        return call[0]
    if job.state == "dispatching":
        return job.runner
    return None


def _stale(job: JobRecord) -> LeaseTokenStale:
    return LeaseTokenStale(
        f"job {job.slug!r}: the lease token is not the current one (the job is {job.state}); "
        "drop this call"
    )


def _token(token: str | None) -> str:
    assert token is not None, "checked by _check"
    return token


def _actor(runtime: str) -> str:
    return f"worker:{runtime}"
