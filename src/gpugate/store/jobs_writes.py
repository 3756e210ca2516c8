"""The lease holder's fenced writes, the operator verbs and the rescue, once for every backend.

Each method validates its arguments, takes the time from the clock and hands one decision
(a function of :mod:`gpugate.store.jobs_transitions`) to one of two primitives the backend
implements, each a single transaction:

* :meth:`JobWrites._change_leased` reads the job only when it is ``dispatching``/``running``
  and holds ``token`` (the fence), locked, and writes what the decision says with its event;
* :meth:`JobWrites._change_job` does the same for the job whatever its lease (operator verbs).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import partial
from typing import TYPE_CHECKING, Any

from gpugate.store import jobs_transitions as transitions
from gpugate.store.jobs_base import JobRecord, check_actor, check_aware, check_runtime

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

    from gpugate.clock import Clock

    Decide = Callable[[JobRecord], transitions.Change]


class JobWrites(ABC):
    """The writes of :class:`gpugate.store.base.JobStore` that change one existing job."""

    _clock: Clock

    @abstractmethod
    async def _change_leased(
        self, slug: str, token: str, now: datetime, decide: Decide
    ) -> JobRecord | None:
        """In one transaction: lock the job if leased with ``token``, apply ``decide``'s change
        and event (at ``now``), return the job as written; None when the fence refuses.
        """

    @abstractmethod
    async def _change_job(self, slug: str, now: datetime, decide: Decide) -> JobRecord | None:
        """:meth:`_change_leased` without the fence; None for an unknown slug."""

    async def promote_runner(
        self, slug: str, token: str, runtime: str, *, actor: str = "dispatcher"
    ) -> bool:
        check_runtime(runtime)
        check_actor(actor)
        now = self._clock.now()
        decide = partial(transitions.promote, now=now, runtime=runtime, actor=actor)
        return await self._change_leased(slug, token, now, decide) is not None

    async def record_submit(
        self,
        slug: str,
        token: str,
        *,
        runtime: str,
        call_id: str,
        lease_s: float,
        running: bool,
        actor: str = "dispatcher",
    ) -> bool:
        check_runtime(runtime)
        transitions.check_lease_s(lease_s)
        check_actor(actor)
        if not call_id:
            raise ValueError("a submit needs the runtime's call id")
        now = self._clock.now()
        decide = partial(
            transitions.submit,
            now=now,
            runtime=runtime,
            call_id=call_id,
            lease_s=lease_s,
            running=running,
            actor=actor,
        )
        return await self._change_leased(slug, token, now, decide) is not None

    async def record_attempt_failure(
        self,
        slug: str,
        token: str,
        *,
        runtime: str,
        error_code: str,
        message: str,
        retryable: bool,
        actor: str = "dispatcher",
    ) -> bool:
        check_runtime(runtime)
        check_actor(actor)
        now = self._clock.now()
        decide = partial(
            transitions.attempt_failure,
            now=now,
            runtime=runtime,
            error_code=error_code,
            message=message,
            retryable=retryable,
            actor=actor,
        )
        return await self._change_leased(slug, token, now, decide) is not None

    async def release(
        self,
        slug: str,
        token: str,
        *,
        not_before: datetime | None = None,
        status: str = "released",
        error_code: str | None = None,
        actor: str = "dispatcher",
    ) -> bool:
        if status not in transitions.RELEASE_STATUSES:
            raise ValueError(f"release status must be released or deferred, got {status!r}")
        check_actor(actor)
        check_aware(not_before, "not_before")
        now = self._clock.now()
        decide = partial(
            transitions.release,
            now=now,
            not_before=not_before,
            status=status,
            error_code=error_code,
            actor=actor,
        )
        return await self._change_leased(slug, token, now, decide) is not None

    async def extend_lease(self, slug: str, token: str, *, lease_s: float) -> datetime | None:
        transitions.check_lease_s(lease_s)
        now = self._clock.now()
        decide = partial(_extend, now=now, lease_s=lease_s)
        job = await self._change_leased(slug, token, now, decide)
        return None if job is None else job.lease_expires_at

    async def mark_running(self, slug: str, token: str, *, actor: str) -> bool:
        check_actor(actor)
        now = self._clock.now()
        decide = partial(transitions.mark_running, now=now, actor=actor)
        return await self._change_leased(slug, token, now, decide) is not None

    async def record_progress(
        self, slug: str, token: str, detail: dict[str, Any], *, actor: str | None = None
    ) -> bool:
        if actor is not None:
            check_actor(actor)
        now = self._clock.now()
        decide = partial(transitions.progress, now=now, detail=detail, actor=actor)
        return await self._change_leased(slug, token, now, decide) is not None

    async def complete(
        self,
        slug: str,
        token: str,
        *,
        result: Any,
        cost_cents: float | None = None,
        actor: str,
        result_ref: str | None = None,
    ) -> bool:
        check_actor(actor)
        now = self._clock.now()
        decide = partial(
            transitions.complete,
            now=now,
            result=result,
            result_ref=result_ref,
            cost_cents=cost_cents,
            actor=actor,
        )
        return await self._change_leased(slug, token, now, decide) is not None

    async def fail(
        self, slug: str, token: str, *, error_code: str, message: str, actor: str
    ) -> bool:
        check_actor(actor)
        if not error_code:
            raise ValueError("a failed job needs an error code")
        now = self._clock.now()
        decide = partial(
            transitions.fail, now=now, error_code=error_code, message=message, actor=actor
        )
        return await self._change_leased(slug, token, now, decide) is not None

    async def cancel_job(self, slug: str, *, actor: str) -> JobRecord | None:
        check_actor(actor)
        now = self._clock.now()
        return await self._change_job(slug, now, partial(transitions.cancel, now=now, actor=actor))

    async def retry_job(self, slug: str, *, actor: str) -> JobRecord | None:
        check_actor(actor)
        now = self._clock.now()
        return await self._change_job(slug, now, partial(transitions.retry, now=now, actor=actor))

    async def rescue(
        self, slug: str, token: str, *, max_rescues: int, actor: str = "reaper"
    ) -> JobRecord | None:
        if max_rescues < 0:
            raise ValueError(f"max_rescues must be at least 0, got {max_rescues}")
        check_actor(actor)
        now = self._clock.now()
        decide = partial(transitions.rescue, now=now, max_rescues=max_rescues, actor=actor)
        return await self._change_leased(slug, token, now, decide)


def _extend(_job: JobRecord, *, now: datetime, lease_s: float) -> transitions.Change:
    return transitions.extend(now=now, lease_s=lease_s)
