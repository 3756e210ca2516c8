"""The budget rule (DESIGN §5 Guardrails): what a call may charge against a runtime's day.

A runtime with ``daily_cents`` is over budget once today's spend (settled costs plus open
reservations) reaches ``BUDGET_FACTOR x daily_cents``; a reservation fits while the spend plus
its estimate stays within that limit (:meth:`Cost.fits`). The store applies the rule atomically
across replicas (one conditional upsert, ``gpugate.store.ledger``).
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


@dataclass(frozen=True, slots=True)
class Cost:
    """What a reservation charges: ``estimate_cents`` against ``limit_cents`` for today, and the
    rate a duration is settled at."""

    estimate_cents: float
    limit_cents: float
    cents_per_second: float

    def fits(self, spent_cents: float) -> bool:
        """Whether ``spent_cents`` plus the estimate stays within the limit."""
        return spent_cents + self.estimate_cents <= self.ceiling_cents

    @property
    def ceiling_cents(self) -> float:
        """The limit with the tolerance of :meth:`fits`: what backends compare against in SQL."""
        return self.limit_cents + _EPSILON
