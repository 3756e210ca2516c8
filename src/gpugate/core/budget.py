"""The budget rule (DESIGN §5 Guardrails): what a call may charge against a runtime's day.

A runtime with ``daily_cents`` is over budget once today's spend (settled costs plus open
reservations) reaches ``BUDGET_FACTOR x daily_cents`` (:func:`over_budget`). A reservation is
admitted while the spend before it is still below that limit, whatever its own estimate
(:meth:`Cost.admits`): the call that crosses the limit is the last one of the day, so the day
overshoots by at most that one call's estimate — and a runtime whose limit is below one estimate
still runs a call a day, rather than none. The store applies the rule atomically across
replicas (one conditional upsert, ``gpugate.store.ledger``), against :attr:`Cost.refuse_at_cents`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

BUDGET_FACTOR = 2
"""A runtime is over budget when today's spend reaches ``BUDGET_FACTOR x daily_cents``."""

_EPSILON = 1e-9  # cents: float sums of equal estimates must reach the limit exactly

Reserved = Literal["reserved", "at_capacity", "over_budget", "stale"]
"""What a reservation answers: taken; no slot free; no room in today's budget; the job's lease
is gone (nothing changed in any case but the first)."""


def over_budget(spent_cents: float, daily_cents: float) -> bool:
    """Whether ``spent_cents`` today is over a budget of ``daily_cents``: at or past
    ``BUDGET_FACTOR x daily_cents`` (within the float tolerance of :meth:`Cost.admits`)."""
    return spent_cents >= BUDGET_FACTOR * daily_cents - _EPSILON


@dataclass(frozen=True, slots=True)
class Cost:
    """What a reservation charges: ``estimate_cents`` against ``limit_cents`` for today, and the
    rate a duration is settled at."""

    estimate_cents: float
    limit_cents: float
    cents_per_second: float

    def admits(self, spent_cents: float) -> bool:
        """Whether a reservation fits after ``spent_cents`` today: the spend is still below the
        limit (the estimate may carry it past: by at most this one call)."""
        return spent_cents < self.refuse_at_cents

    @property
    def refuse_at_cents(self) -> float:
        """The spend from which :meth:`admits` refuses (the limit, less the float tolerance):
        what backends compare against in SQL."""
        return self.limit_cents - _EPSILON
