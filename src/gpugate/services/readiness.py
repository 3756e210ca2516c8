"""Readiness: may this process take traffic? Each check is listed: an operator sees which failed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

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
