"""What the store keeps of spend and call slots (DESIGN §5 Guardrails), and its values.

* **A reservation** (:meth:`LedgerStore.reserve_call`), taken by the dispatcher before each
  submit to a runtime with a budget or a ``max_concurrency``, in ONE transaction:

  - the call slot: the job's ``leased_by`` becomes ``<runtime>:`` + :data:`RESERVED_CALL` only
    when fewer than ``max_concurrency`` calls of the runtime are leased. Calls are counted
    under a per-runtime lock (PostgreSQL: an advisory transaction lock; SQLite: the single
    writer), so two replicas can never both take the last slot. The slot is held by the job
    row itself: it frees when the job's call ends, however it ends, with nothing to release.
  - the budget: today's spend row (``spend_days``) grows by the estimate only when the new
    total stays within the limit (``2 x daily_cents``) — one conditional upsert that serialises
    on the row — and the ledger entry (``reserved``, ``estimated``) is written with it.

* **Settlement** (:meth:`LedgerStore.settle_ledger`): an entry whose job no longer holds the
  lease token it was reserved under belongs to a call that ended. It is settled at the cost the
  runtime reported (``reported``) or the call's duration x ``cents_per_second`` (``estimated``)
  when the job completed on that runtime, and released (0 cents) otherwise (the submit failed,
  the call was lost, cancelled or failed); today's spend moves by the difference.

* **The soft cap**: :meth:`LedgerStore.mark_soft_cap` records, once per runtime and UTC day, that
  the day's spend reached ``daily_cents``, with its audit event, in one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gpugate.core.budget import BUDGET_FACTOR, Cost, Reserved
from gpugate.core.lease import RESERVED_CALL

if TYPE_CHECKING:
    from datetime import date, datetime

__all__ = [
    "BUDGET_FACTOR",
    "RESERVED_CALL",
    "SOFT_CAP_ACTION",
    "Cost",
    "LedgerEntry",
    "LedgerStore",
    "Reserved",
    "SpendDay",
]


SOFT_CAP_ACTION = "runtime.soft_cap"
"""Audit action written (once per runtime and UTC day) when today's spend reaches daily_cents."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One call's charge: ``reserved`` (the estimate), ``settled`` or ``released`` (0)."""

    id: int
    runtime: str
    day: date
    slug: str
    call_id: str | None
    cents: float
    source: str
    state: str
    at: datetime
    settled_at: datetime | None


@dataclass(frozen=True, slots=True)
class SpendDay:
    """A runtime's spend on one UTC day: settled costs plus open reservations."""

    day: date
    cents: float


class LedgerStore(Protocol):
    """The guardrails part of :class:`gpugate.store.Store`."""

    async def reserve_call(
        self,
        slug: str,
        token: str,
        runtime: str,
        *,
        max_concurrency: int | None,
        cost: Cost | None,
    ) -> Reserved:
        """Take a call slot (``max_concurrency`` not None) and reserve ``cost`` (not None) for
        the job holding ``token``, both or neither, atomically across replicas (module doc)."""
        ...

    async def release_call(self, slug: str, token: str, runtime: str) -> None:
        """The submit after a reservation failed: the slot goes back (``leased_by`` is the
        dispatcher's again) and the open entry of this lease on ``runtime`` is released."""
        ...

    async def settle_ledger(self, *, limit: int = 500) -> int:
        """Settle or release up to ``limit`` entries whose call ended; how many."""
        ...

    async def spend_days(self, since: date) -> dict[str, list[SpendDay]]:
        """Every runtime's spend per day from ``since`` on, oldest first."""
        ...

    async def ledger_entries(self, runtime: str, *, limit: int = 50) -> list[LedgerEntry]:
        """``runtime``'s latest entries, newest first."""
        ...

    async def mark_soft_cap(self, runtime: str, day: date, daily_cents: float) -> bool:
        """When ``runtime``'s spend on ``day`` reached ``daily_cents`` and was not marked yet:
        mark it and append the :data:`SOFT_CAP_ACTION` audit event (one transaction); True
        only for the call that marked it (once per runtime and day, across replicas)."""
        ...
