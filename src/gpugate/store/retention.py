"""The retention purge (issue #15 finding 4), once for both backends: delete finished rows
older than a cut-off, at most ``limit`` rows a call, so one call is one short transaction and a
big backlog is worked off in many (``services/retention.py`` loops).

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

On PostgreSQL each batch is chosen ``FOR UPDATE SKIP LOCKED``, so replicas purging at once take
disjoint batches and never wait for each other nor delete a row twice (SQLite's one writer
needs no row locks; the converter drops them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gpugate.store.dialect import Json, count_rows, sql
from gpugate.store.tx import Driven, count, rows

if TYPE_CHECKING:
    from datetime import datetime

    from gpugate.store.tx import Tx


@dataclass(frozen=True, slots=True)
class Purged:
    """What one purge call deleted: how many rows (the parent rows: jobs, batches, files),
    and the blob keys those rows held."""

    rows: int
    blob_keys: list[str] = field(default_factory=list)


_JOBS = sql("""
DELETE FROM jobs WHERE id IN (
    SELECT id FROM jobs INDEXED BY jobs_finished
    WHERE finished_at < :before AND state IN ('completed', 'failed', 'cancelled')
    ORDER BY finished_at LIMIT :limit FOR UPDATE SKIP LOCKED)
RETURNING input_ref, result_ref""")
_BATCHES = sql("""
DELETE FROM batches WHERE id IN (
    SELECT id FROM batches WHERE status IN ('completed', 'failed', 'expired', 'cancelled')
      AND coalesce(completed_at, failed_at, cancelled_at, expires_at, created_at) < :before
    LIMIT :limit FOR UPDATE SKIP LOCKED)
RETURNING input_file_id, output_file_id, error_file_id""")
# An input file another batch still names is kept.
_FILES = sql(
    """
DELETE FROM batch_files WHERE id IN (SELECT value FROM json_each(:files))
  AND id NOT IN (SELECT input_file_id FROM batches
      UNION ALL SELECT output_file_id FROM batches WHERE output_file_id IS NOT NULL
      UNION ALL SELECT error_file_id FROM batches WHERE error_file_id IS NOT NULL)
RETURNING blob_key""",
    postgres="""
DELETE FROM batch_files WHERE id IN (SELECT jsonb_array_elements_text(:files))
  AND id NOT IN (SELECT input_file_id FROM batches
      UNION ALL SELECT output_file_id FROM batches WHERE output_file_id IS NOT NULL
      UNION ALL SELECT error_file_id FROM batches WHERE error_file_id IS NOT NULL)
RETURNING blob_key""",
)
_ORPHAN_FILES = sql("""
DELETE FROM batch_files WHERE id IN (
    SELECT id FROM batch_files WHERE created_at < :before
      AND id NOT IN (SELECT input_file_id FROM batches
          UNION ALL SELECT output_file_id FROM batches WHERE output_file_id IS NOT NULL
          UNION ALL SELECT error_file_id FROM batches WHERE error_file_id IS NOT NULL)
    LIMIT :limit FOR UPDATE SKIP LOCKED)
RETURNING blob_key""")
_AUDIT = sql("""
DELETE FROM audit_events WHERE id IN (
    SELECT id FROM audit_events WHERE at < :before ORDER BY id LIMIT :limit
    FOR UPDATE SKIP LOCKED)""")
_LEDGER = sql("""
DELETE FROM ledger WHERE id IN (
    SELECT id FROM ledger WHERE state <> 'reserved' AND at < :before ORDER BY id LIMIT :limit
    FOR UPDATE SKIP LOCKED)""")
_SPEND_DAYS = sql("DELETE FROM spend_days WHERE day < :day")
_TABLES = sql(
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    " ORDER BY name",
    postgres="SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
    " ORDER BY tablename",
)


def _purge_batches(params: dict[str, object]) -> Tx[Purged]:
    ended = yield from rows(_BATCHES, params)
    files = sorted({file_id for row in ended for file_id in row if file_id})
    keys = [key for (key,) in (yield from rows(_FILES, {"files": Json(files)}))] if files else []
    orphans = [key for (key,) in (yield from rows(_ORPHAN_FILES, params))]
    return Purged(len(ended) + len(keys) + len(orphans), keys + orphans)


def _purge_ledger(params: dict[str, object]) -> Tx[int]:
    entries = yield from count(_LEDGER, params)
    return entries + (yield from count(_SPEND_DAYS, params))


def _table_counts() -> Tx[dict[str, int]]:
    names = [name for (name,) in (yield from rows(_TABLES))]
    counts = {}
    for name in names:
        counts[name] = int((yield from rows(count_rows(name)))[0][0])
    return counts


class RetentionStore(Driven, Protocol):
    """The purge methods of :class:`gpugate.store.Store`; see the module docstring."""

    async def purge_jobs(self, finished_before: datetime, limit: int) -> Purged:
        found = await self._transact(rows(_JOBS, {"before": finished_before, "limit": limit}))
        return Purged(len(found), [key for row in found for key in row if key])

    async def purge_batches(self, ended_before: datetime, limit: int) -> Purged:
        return await self._transact(_purge_batches({"before": ended_before, "limit": limit}))

    async def purge_audit(self, before: datetime, limit: int) -> int:
        return await self._transact(count(_AUDIT, {"before": before, "limit": limit}))

    async def purge_ledger(self, before: datetime, limit: int) -> int:
        params = {"before": before, "limit": limit, "day": before.date()}
        return await self._transact(_purge_ledger(params))

    async def table_counts(self) -> dict[str, int]:
        """Every table's row count, by name (the store's own tables, ``schema_migrations``
        included): a full count, not cheap — for the soak and operators."""
        return await self._query(_table_counts(), single=False)
