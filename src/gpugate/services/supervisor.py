"""The supervisor: one owner for every background loop of a gateway (issue #17, supervision).

Each loop (dispatcher, reaper, prober, GPU poller, purges, ...) is started by name from a
*factory* — a function answering a fresh coroutine — so it can be started again. The supervisor
owns the tasks, TaskGroup-style: none outlives it, :meth:`Supervisor.stop` cancels and awaits
every one, and a loop's failure never reaches its siblings. A loop that raises is logged,
counted (``on_restart(name)``: ``gateway_loop_restarts_total{loop}``) and started again after a
full-jitter backoff (:class:`~gpugate.retry.Backoff`, ``base_s`` doubling to ``max_s``; a loop
that ran ``healthy_after_s`` without failing starts the count over). A loop that returns has
finished (the dispatcher after its ``stop()``): it is not restarted.

:meth:`Supervisor.problems` is what ``/readyz`` reports: a loop that is *down* (failed, waiting
for its restart) or *restarting in a tight cycle* (``tight_restarts`` restarts within
``tight_window_s``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

from gpugate.clock import Clock
from gpugate.retry import Backoff

log = logging.getLogger("gpugate.supervisor")

LoopFactory = Callable[[], Coroutine[Any, Any, None]]
LoopState = Literal["running", "restarting", "finished"]
_MIN_DELAY_S = 0.01  # full jitter may draw 0: never restart in the same instant


@dataclass(slots=True)
class LoopStatus:
    """One supervised loop, as ``/readyz`` and the log see it."""

    name: str
    state: LoopState = "running"
    restarts: int = 0
    last_error: str = ""
    recent: deque[float] = field(default_factory=deque)  # monotonic times of recent restarts


class Supervisor:
    """Owns the gateway's loops; see the module docstring."""

    def __init__(
        self,
        clock: Clock,
        on_restart: Callable[[str], None] | None = None,
        *,
        base_s: float = 0.5,
        max_s: float = 30.0,
        healthy_after_s: float = 60.0,
        tight_restarts: int = 3,
        tight_window_s: float = 60.0,
    ) -> None:
        self._clock = clock
        self._on_restart = on_restart
        self._backoff = Backoff(base_s, max_s)
        self._healthy_after_s = healthy_after_s
        self._tight_restarts = tight_restarts
        self._tight_window_s = tight_window_s
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._status: dict[str, LoopStatus] = {}
        self._stopping: asyncio.Task[None] | None = None

    # -- starting --------------------------------------------------------------------------

    def start(self, name: str, factory: LoopFactory) -> None:
        """Run ``factory()`` as the loop ``name``, restarted whenever it raises."""
        if name in self._tasks:
            raise ValueError(f"loop {name} is already running")
        status = self._status[name] = LoopStatus(name)
        self._tasks[name] = asyncio.create_task(
            self._supervise(status, factory), name=f"gpugate.{name}"
        )

    async def _supervise(self, status: LoopStatus, factory: LoopFactory) -> None:
        failures = 0
        while True:
            started = self._clock.monotonic()
            status.state = "running"
            try:
                await factory()
            except Exception as exc:  # a loop's failure stays its own: restart it
                if self._clock.monotonic() - started >= self._healthy_after_s:
                    failures = 0
                failures += 1
                delay = max(_MIN_DELAY_S, self._backoff.delay(failures))
                status.state, status.last_error = "restarting", f"{type(exc).__name__}: {exc}"
                log.exception(
                    "loop %s failed (%d in a row); restarting in %.2f s", status.name, failures,
                    delay,
                )  # fmt: skip
                await self._clock.sleep(delay)
                self._restarted(status)
                continue
            status.state = "finished"
            return

    def _restarted(self, status: LoopStatus) -> None:
        now = self._clock.monotonic()
        status.restarts += 1
        status.recent.append(now)
        while status.recent and now - status.recent[0] > self._tight_window_s:
            status.recent.popleft()
        while len(status.recent) > self._tight_restarts:  # bounded: only the tight test reads it
            status.recent.popleft()
        if self._on_restart is not None:
            self._on_restart(status.name)

    # -- health ----------------------------------------------------------------------------

    def status(self, name: str) -> LoopStatus | None:
        return self._status.get(name)

    def problems(self) -> list[str]:
        """Every loop that is down or restarting in a tight cycle, said in one phrase each."""
        now = self._clock.monotonic()
        found: list[str] = []
        for status in self._status.values():
            tight = sum(1 for t in status.recent if now - t <= self._tight_window_s)
            if status.state == "restarting":
                found.append(f"{status.name} is down ({status.last_error}), restarting")
            elif tight >= self._tight_restarts:
                found.append(
                    f"{status.name} restarted {tight} times in {self._tight_window_s:g} s "
                    f"({status.last_error})"
                )
        return found

    # -- stopping --------------------------------------------------------------------------

    async def stop(self) -> None:
        """Cancel and await every loop."""
        await self.stop_named(tuple(self._tasks))
        if self._stopping is not None:
            await self._stopping

    async def stop_named(self, names: tuple[str, ...]) -> None:
        """Cancel and await the named loops that run (the others go on)."""
        tasks = [self._tasks.pop(name) for name in names if name in self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for name in names:
            if (status := self._status.get(name)) is not None:
                status.state = "finished"

    async def finish(self, names: tuple[str, ...], *, within_s: float) -> None:
        """Wait (bounded) for the named loops to return by themselves; cancel what is left."""
        tasks = [self._tasks[name] for name in names if name in self._tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=within_s)
        await self.stop_named(names)

    def stop_soon(self, names: tuple[str, ...]) -> None:
        """:meth:`stop_named` from synchronous code: the stopping task is owned here."""
        self._stopping = asyncio.create_task(self.stop_named(names), name="gpugate.stop-loops")

    def __repr__(self) -> str:
        states = ", ".join(f"{s.name}={s.state}" for s in self._status.values())
        return f"<Supervisor {states}>"
