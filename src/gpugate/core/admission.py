"""Per-upstream admission: at most ``max_inflight`` requests at once, the rest queue by class.

A free slot is granted at once. Otherwise the request waits in a priority queue — ``system``
before ``interactive`` before ``batch``, first come first served within a class — for at most
``timeout_s`` of the injected clock's time. A full queue refuses at once.

Slots are never lost: a released slot goes straight to the highest-priority waiter; a waiter
that is cancelled or times out leaves the queue, and a slot handed to it at that very moment is
passed on to the next waiter.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Self

from gpugate.core.classes import RequestClass, by_priority
from gpugate.errors import QueueFull, QueueTimeout

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from gpugate.clock import Clock

_Waiter = asyncio.Future[None]


class Slot:
    """The right to send one request upstream. Release it once (more releases do nothing).

    Also an async context manager that releases on exit.
    """

    __slots__ = ("_on_release", "_released")

    def __init__(self, on_release: Callable[[], None]) -> None:
        self._on_release = on_release
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._on_release()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<Slot {'released' if self._released else 'held'}>"


class AdmissionPool:
    """The admission slots and queue of one upstream."""

    def __init__(self, max_inflight: int, max_queue: int, clock: Clock) -> None:
        _check_limits(max_inflight, max_queue)
        self._max_inflight = max_inflight
        self._max_queue = max_queue
        self._clock = clock
        self._inflight = 0
        self._queues: dict[RequestClass, deque[_Waiter]] = {cls: deque() for cls in by_priority()}

    @property
    def inflight(self) -> int:
        """Slots held now (a slot handed to a waiter that has not resumed yet counts)."""
        return self._inflight

    @property
    def max_inflight(self) -> int:
        return self._max_inflight

    @property
    def max_queue(self) -> int:
        return self._max_queue

    @property
    def queued(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def queued_by_class(self) -> dict[RequestClass, int]:
        return {cls: len(queue) for cls, queue in self._queues.items()}

    def try_acquire(self) -> Slot | None:
        """A slot if one is free and nobody waits (the hot path: no coroutine, no queue)."""
        if self._inflight < self._max_inflight and not any(self._queues.values()):  # no waiter
            self._inflight += 1
            return Slot(self._release_slot)
        return None

    def queued_in(self, cls: RequestClass) -> int:
        """How many ``cls`` requests wait now."""
        return len(self._queues[cls])

    async def acquire(self, cls: RequestClass, timeout_s: float) -> Slot:
        """A slot, at once if one is free, else after waiting in the ``cls`` queue.

        Raises :class:`~gpugate.errors.QueueFull` at once when ``max_queue`` requests already
        wait, and :class:`~gpugate.errors.QueueTimeout` after ``timeout_s`` without a slot.
        """
        if self._inflight < self._max_inflight and not any(self._queues.values()):  # no waiter
            self._inflight += 1
            return Slot(self._release_slot)
        if self.queued >= self._max_queue:
            raise QueueFull(
                f"{self.queued} requests already queued (max_queue={self._max_queue})",
                retry_after_s=retry_after_s(timeout_s),
            )
        waiter: _Waiter = asyncio.get_running_loop().create_future()
        self._queues[cls].append(waiter)
        try:
            granted = await self._wait(waiter, timeout_s)
        except asyncio.CancelledError:
            self._abandon(cls, waiter)
            raise
        if not granted:
            self._abandon(cls, waiter)
            raise QueueTimeout(
                f"no slot within {timeout_s:g}s ({cls} request)",
                retry_after_s=retry_after_s(timeout_s),
            )
        return Slot(self._release_slot)

    def resize(self, max_inflight: int) -> None:
        """Change ``max_inflight`` (config reload). Growing admits waiters at once; shrinking
        lets the requests in flight finish and admits no one until below the new limit."""
        _check_limits(max_inflight, self._max_queue)
        self._max_inflight = max_inflight
        self._hand_on()

    async def _wait(self, waiter: _Waiter, timeout_s: float) -> bool:
        """Whether ``waiter`` was granted a slot before ``timeout_s`` of clock time passed."""
        timer = asyncio.ensure_future(self._clock.sleep(timeout_s))
        try:
            await asyncio.wait((waiter, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        return waiter.done()  # a grant at the moment of the timeout still counts

    def _abandon(self, cls: RequestClass, waiter: _Waiter) -> None:
        """``waiter`` gives up: leave the queue, or pass on the slot it was just handed."""
        if waiter.done() and not waiter.cancelled():
            self._release_slot()
            return
        waiter.cancel()
        queue = self._queues[cls]
        if waiter in queue:
            queue.remove(waiter)

    def _release_slot(self) -> None:
        self._inflight -= 1
        if any(self._queues.values()):  # someone may wait (the hot path: nobody, no calls)
            self._hand_on()

    def _hand_on(self) -> None:
        """Give free slots to waiters, highest class first, FIFO within a class."""
        while self._inflight < self._max_inflight:
            waiter = self._next_waiter()
            if waiter is None:
                return
            self._inflight += 1
            waiter.set_result(None)

    def _next_waiter(self) -> _Waiter | None:
        for queue in self._queues.values():  # built highest priority first
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    return waiter
        return None

    def __repr__(self) -> str:
        queued = " ".join(f"{cls}:{n}" for cls, n in self.queued_by_class().items())
        return f"<AdmissionPool inflight={self._inflight}/{self._max_inflight} queued={queued}>"


def retry_after_s(timeout_s: float) -> float:
    """What a refused client is told to wait: half the queue timeout, at least a second."""
    return float(max(1, round(timeout_s / 2)))


def _check_limits(max_inflight: int, max_queue: int) -> None:
    if max_inflight < 1:
        raise ValueError(f"max_inflight must be at least 1, got {max_inflight}")
    if max_queue < 0:
        raise ValueError(f"max_queue must not be negative, got {max_queue}")
