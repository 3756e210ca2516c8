"""Readiness: may this process take traffic? Each check is listed: an operator sees which failed.

The :class:`Lifecycle` is the replica's phase on its way out (serving, draining, stopping, cut):
the readiness check ``lifecycle`` fails from the moment a drain begins."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from gpugate.clock import Clock
from gpugate.errors import GpugateError

log = logging.getLogger("gpugate.readiness")


@dataclass(frozen=True, slots=True)
class Check:
    """One readiness check and its outcome."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True, slots=True)
class Readiness:
    """Every check; ready only when all pass."""

    checks: tuple[Check, ...]

    @property
    def ready(self) -> bool:
        return all(check.ok for check in self.checks)

    def as_json(self) -> dict[str, object]:
        return {
            "ready": self.ready,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
        }


async def probe(name: str, ping: Callable[[], Awaitable[str]], timeout_s: float = 2.0) -> Check:
    """Run one check with a timeout; a gpugate error or a timeout is a failed check, not a crash.

    ``/readyz`` is open to anyone, so a failed check shows the error's public message (a store
    error names no host, user or file there); the whole message goes to the log.
    """
    try:
        detail = await asyncio.wait_for(ping(), timeout_s)
    except TimeoutError:
        return Check(name, ok=False, detail=f"no answer within {timeout_s:g} s")
    except GpugateError as exc:
        if exc.internal:
            log.warning("readiness check %s failed: %s", name, exc.message)
        return Check(name, ok=False, detail=exc.public_message)
    return Check(name, ok=True, detail=detail)


Phase = Literal["serving", "draining", "stopping", "cut"]


class Lifecycle:
    """Where a replica is in its life, for ``/readyz`` and for whoever must act on a phase.

    ``serving`` → ``draining`` (SIGTERM: ``/readyz`` answers 503 while requests are still
    served, ``server.drain_delay_s``, so load balancers stop sending) → ``stopping`` (no new
    connections; what is in flight may finish within ``server.shutdown_grace_s``) → ``cut``
    (the grace is over: what is left is answered 503 or ends with ``event: error``). Phases only
    move forward; each listener of a phase is called once, when it begins.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.phase: Phase = "serving"
        self.deadline: float | None = None  # clock.monotonic() when the grace ends (stopping)
        self._listeners: dict[Phase, list[Callable[[], None]]] = {}

    @property
    def ready(self) -> bool:
        return self.phase == "serving"

    def on(self, phase: Phase, listener: Callable[[], None]) -> None:
        """Call ``listener()`` when ``phase`` begins (at once if it has begun)."""
        if _PHASES.index(self.phase) >= _PHASES.index(phase):
            listener()
        else:
            self._listeners.setdefault(phase, []).append(listener)

    def drain(self) -> None:
        self._enter("draining")

    def stop(self, grace_s: float | None = None) -> None:
        """No new connections; with ``grace_s``, in-flight work has until then to finish."""
        if grace_s is not None and self.deadline is None:
            self.deadline = self._clock.monotonic() + grace_s
        self._enter("stopping")

    def cut(self) -> None:
        self._enter("cut")

    def remaining_s(self) -> float:
        """Seconds left of the grace (0 when no grace was given or it is over)."""
        if self.deadline is None:
            return 0.0
        return max(0.0, self.deadline - self._clock.monotonic())

    def _enter(self, phase: Phase) -> None:
        for passed in _PHASES[_PHASES.index(self.phase) + 1 : _PHASES.index(phase) + 1]:
            self.phase = passed
            for listener in self._listeners.pop(passed, []):
                listener()

    def __repr__(self) -> str:
        return f"<Lifecycle {self.phase} remaining={self.remaining_s():.1f} s>"


_PHASES: tuple[Phase, ...] = ("serving", "draining", "stopping", "cut")
