"""Python's cyclic garbage collector, run between requests (issue #21, the burst tail).

Left to itself the collector runs inside whichever request happens to allocate its 700th object:
under a burst of 64 requests that is several young collections per burst, a middle one every few
bursts and now and then a full one — each a stop of the event loop that every request of the
burst waits out (``bench/proxy_bursts.py --gc-watch``: 54 young, 5 middle and up to one full
collection in 3 s of bursts, a full one 25 to 60 ms on the bench's shared core; ~8 % of the CPU
of a wrk run). The data plane leaves no reference cycles per request (only a closed connection
does), so the collections can wait for a quiet moment:

- :meth:`IdleCollector.start` raises the collector's own trigger to :data:`SAFETY_YOUNG` net
  allocations (a bound on what can pile up when the gateway never has a quiet moment, not a
  schedule);
- every :data:`TICK_S` a timer looks: when ``busy()`` is false (the fast path's: no request is
  waiting for its answer to begin — a stream waiting for its next token is not work) and more
  than :data:`YOUNG` objects were allocated since the last collection, it runs the collection
  CPython would have run — the young generation, the middle one after 10 of those, everything
  after 10 middle ones — so the same work is done, between requests instead of inside them.

Process-wide (``gc`` is): the first collector started sets the trigger, the last one stopped puts
back what it found.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

#: How often the collector looks for a quiet moment.
TICK_S = 0.25
#: Net allocations of tracked objects since the last collection above which a quiet moment
#: collects (CPython's own trigger is 700).
YOUNG = 700
#: The collector's own trigger while an :class:`IdleCollector` runs: what a gateway that is never
#: idle may pile up before a collection runs inside a request anyway.
SAFETY_YOUNG = 50_000
#: Collections of a generation before the next older one is collected too (CPython's 10, 10).
OLDER_EVERY = 10

_running: list[IdleCollector] = []
_saved: list[tuple[int, int, int]] = []


class IdleCollector:
    """Runs the cyclic collector's collections when ``busy()`` says nothing is in flight."""

    def __init__(self, busy: Callable[[], bool], *, tick_s: float = TICK_S) -> None:
        self.busy = busy
        self.tick_s = tick_s
        self.collections = [0, 0, 0]  # run by this collector, per generation
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Take over the collector's schedule (from the running loop)."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        if not _running:
            _saved.append(gc.get_threshold())
            gc.set_threshold(SAFETY_YOUNG, OLDER_EVERY, OLDER_EVERY)
        _running.append(self)
        self._timer = self._loop.call_later(self.tick_s, self._tick)

    def stop(self) -> None:
        """Hand the schedule back (the last collector stopped restores the trigger)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self in _running:
            _running.remove(self)
            if not _running and _saved:
                gc.set_threshold(*_saved.pop())
        self._loop = None

    def collect_if_due(self) -> int | None:
        """The collection CPython would run now, if one is due and nothing is busy; the
        generation collected, or None."""
        young, middle, old = gc.get_count()
        if young <= YOUNG or self.busy():
            return None
        generation = 2 if old >= OLDER_EVERY else 1 if middle >= OLDER_EVERY else 0
        gc.collect(generation)
        self.collections[generation] += 1
        return generation

    def _tick(self) -> None:
        loop = self._loop
        if loop is None:
            return
        self.collect_if_due()
        self._timer = loop.call_later(self.tick_s, self._tick)
