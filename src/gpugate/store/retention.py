"""What the retention purge asks of a store (issue #15 finding 4): delete finished rows older
than a cut-off, at most ``limit`` rows a call, so one call is one short transaction and a big
backlog is worked off in many (``services/retention.py`` loops).

* :meth:`RetentionStore.purge_jobs`: terminal jobs (``completed``, ``failed``, ``cancelled``)
  finished before the cut-off, their events with them (``ON DELETE CASCADE``); the blob keys
  they held (input, result) are handed back for the caller to delete. A job's idempotency key
  goes with it.
* :meth:`RetentionStore.purge_batches`: ended batches (``completed``, ``failed``, ``expired``,
  ``cancelled``) that ended before the cut-off, with their lines and their files (input, output,
  error — an input file another batch still names is kept), and uploaded files no batch names
  created before it; the files' blob keys are handed back.
* :meth:`RetentionStore.purge_audit`: audit events before the cut-off.
* :meth:`RetentionStore.purge_ledger`: settled or released ledger entries before the cut-off,
  and the daily spend rows of days before it (a reservation still open is never touched).

On PostgreSQL each batch is chosen ``FOR UPDATE SKIP LOCKED``, so replicas purging at once
neither wait for each other nor delete a row twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from datetime import datetime


@dataclass(frozen=True, slots=True)
class Purged:
    """What one purge call deleted: how many rows (the parent rows: jobs, batches, files),
    and the blob keys those rows held."""

    rows: int
    blob_keys: list[str] = field(default_factory=list)


class RetentionStore(Protocol):
    """The purge methods of a store; see the module docstring."""

    async def purge_jobs(self, finished_before: datetime, limit: int) -> Purged: ...

    async def purge_batches(self, ended_before: datetime, limit: int) -> Purged: ...

    async def purge_audit(self, before: datetime, limit: int) -> int: ...

    async def purge_ledger(self, before: datetime, limit: int) -> int: ...

    async def table_counts(self) -> dict[str, int]:
        """Every table's row count, by name (the store's own tables, ``schema_migrations``
        included): a full count, not cheap — for the soak and operators."""
        ...
