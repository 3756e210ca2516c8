"""Time, injected: the system clock for production, a manual one for tests.

Loops and stores take a :class:`Clock` instead of calling ``time`` or ``datetime.now`` so tests
advance time instead of sleeping.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """What every time-dependent part of gpugate asks of the time."""

    def now(self) -> datetime:
        """The wall-clock time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences mean anything."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...


def honour_cancellation() -> None:
    """Raise :class:`asyncio.CancelledError` if this task was asked to stop.

    A library that catches the cancellation of a call it was awaiting and carries on (the
    request was cancelled, the task was not) leaves the task running with the request pending;
    a loop that then sleeps would never stop, and shutdown would wait for it for ever. Every
    loop sleeps through a :class:`Clock`, so that is where the request is honoured.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def sleep_or_wake(clock: Clock, event: asyncio.Event, timeout_s: float) -> None:
    """Wait until ``event`` is set or ``timeout_s`` of ``clock``'s time has passed, whichever
    comes first; both waiters are cancelled and awaited before it returns. A stop request of the
    calling task is honoured first (:func:`honour_cancellation`)."""
    honour_cancellation()
    if event.is_set():
        return
    woken = asyncio.ensure_future(event.wait())
    slept = asyncio.ensure_future(clock.sleep(timeout_s))
    try:
        await asyncio.wait({woken, slept}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in (woken, slept):
            waiter.cancel()
        await asyncio.gather(woken, slept, return_exceptions=True)


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    # time.monotonic itself, not a method calling it: asked ~9 times per proxied request
    monotonic = staticmethod(time.monotonic)

    async def sleep(self, seconds: float) -> None:
        honour_cancellation()
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return "<SystemClock>"


class ManualClock:
    """A clock that moves only when a test calls :meth:`advance`.

    ``sleep`` returns once the clock has been advanced past the sleeper's deadline.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._mono = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        honour_cancellation()
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._mono + seconds, future))
        await future

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has passed."""
        self._mono += seconds
        self._now += timedelta(seconds=seconds)
        due = [(t, f) for t, f in self._sleepers if t <= self._mono]
        self._sleepers = [(t, f) for t, f in self._sleepers if t > self._mono]
        for _, future in due:
            if not future.done():
                future.set_result(None)

    def __repr__(self) -> str:
        return f"<ManualClock now={self._now.isoformat()} sleepers={len(self._sleepers)}>"
