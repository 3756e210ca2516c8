"""Waiting for a job to finish, for the synchronous job front (``POST /v1/jobs?wait=S``).

Event-driven in-process: everything in this process that finishes a job (the upstream runtime's
calls, the push worker routes, the reaper) calls :meth:`JobWaiter.pulse`, and every waiter
re-reads its job at once. A job finished by another replica sends no pulse here; a waiter
re-reads its job every ``poll_s`` as well (a bounded poll of the store), so it sees that within
``poll_s``. A pulse costs one read per open waiter.

At most ``max_waiters`` wait at once (``server.max_waiters``, issue #15 finding 3): a request
beyond them is answered at once with its job as it is (``202``, created and running; the client
polls ``GET /v1/jobs/{slug}``), so waiting clients cannot grow the reads without bound.
"""

from __future__ import annotations

import asyncio

from gpugate.clock import Clock, sleep_or_wake
from gpugate.store import JobRecord, JobStore


class JobWaiter:
    """Waits for jobs to reach a terminal state; see the module docstring."""

    def __init__(
        self, store: JobStore, clock: Clock, *, poll_s: float = 1.0, max_waiters: int = 512
    ) -> None:
        self._store = store
        self.max_waiters = max_waiters
        self.turned_away = 0
        self._clock = clock
        self._poll_s = poll_s
        self._changed = asyncio.Event()
        self.waiting = 0
        self.pulses = 0

    def pulse(self) -> None:
        """Some job of this process finished: every waiter looks again."""
        self.pulses += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait(self, job: JobRecord, timeout_s: float) -> JobRecord:
        """``job`` as it is once terminal, or as it is after ``timeout_s``."""
        if self.waiting >= self.max_waiters:
            self.turned_away += 1
            return job
        deadline = self._clock.monotonic() + timeout_s
        self.waiting += 1
        try:
            while True:
                changed = self._changed  # taken before the read: no pulse falls in between
                latest = await self._store.get_job(job.slug)
                if latest is None:
                    return job
                job = latest
                remaining = deadline - self._clock.monotonic()
                if job.terminal or remaining <= 0:
                    return job
                await sleep_or_wake(self._clock, changed, min(self._poll_s, remaining))
        finally:
            self.waiting -= 1

    def __repr__(self) -> str:
        return (
            f"<JobWaiter waiting={self.waiting}/{self.max_waiters} pulses={self.pulses}"
            f" turned_away={self.turned_away}>"
        )
