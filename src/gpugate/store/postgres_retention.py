"""The retention purge of the PostgreSQL store (:mod:`gpugate.store.retention`): a mixin of
:class:`gpugate.store.postgres.PostgresStore`. Each batch of rows is chosen ``FOR UPDATE SKIP
LOCKED``: replicas purging at once take disjoint batches and never wait on each other."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpugate.store.retention import (
    BATCH_ENDED_AT,
    ENDED_BATCHES,
    NAMED_FILES,
    TERMINAL_JOBS,
    Purged,
)

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager
    from datetime import datetime

    import psycopg
    from psycopg.rows import TupleRow

    Connection = psycopg.AsyncConnection[TupleRow]

_JOBS = f"""
DELETE FROM jobs WHERE id IN (
    SELECT id FROM jobs
    WHERE finished_at < %(before)s AND state IN {TERMINAL_JOBS}
    ORDER BY finished_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING input_ref, result_ref"""  # noqa: S608 -- constants only; values are bound
_BATCHES = f"""
DELETE FROM batches WHERE id IN (
    SELECT id FROM batches WHERE status IN {ENDED_BATCHES} AND {BATCH_ENDED_AT} < %(before)s
    LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING input_file_id, output_file_id, error_file_id"""  # noqa: S608
_FILES = f"""
DELETE FROM batch_files WHERE id = ANY(%(files)s) AND id NOT IN ({NAMED_FILES})
RETURNING blob_key"""  # noqa: S608
_ORPHAN_FILES = f"""
DELETE FROM batch_files WHERE id IN (
    SELECT id FROM batch_files WHERE created_at < %(before)s AND id NOT IN ({NAMED_FILES})
    LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING blob_key"""  # noqa: S608
_AUDIT = """
DELETE FROM audit_events WHERE id IN (
    SELECT id FROM audit_events WHERE at < %(before)s ORDER BY id LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)"""
_LEDGER = """
DELETE FROM ledger WHERE id IN (
    SELECT id FROM ledger WHERE state <> 'reserved' AND at < %(before)s ORDER BY id
    LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"""
_SPEND_DAYS = "DELETE FROM spend_days WHERE day < %(day)s"
_TABLE_NAMES = (
    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename"
)


class PostgresRetention:
    """The :class:`gpugate.store.retention.RetentionStore` methods of PostgreSQL."""

    if TYPE_CHECKING:

        def _transaction(
            self, *, single: bool = False
        ) -> AbstractAsyncContextManager[Connection]: ...

    async def purge_jobs(self, finished_before: datetime, limit: int) -> Purged:
        async with self._transaction() as conn:
            cursor = await conn.execute(_JOBS, {"before": finished_before, "limit": limit})
            rows = await cursor.fetchall()
        return Purged(len(rows), [key for row in rows for key in row if key])

    async def purge_batches(self, ended_before: datetime, limit: int) -> Purged:
        params = {"before": ended_before, "limit": limit}
        async with self._transaction() as conn:
            ended = await (await conn.execute(_BATCHES, params)).fetchall()
            files = sorted({file_id for row in ended for file_id in row if file_id})
            keys = []
            if files:
                cursor = await conn.execute(_FILES, {"files": files})
                keys = [key for (key,) in await cursor.fetchall()]
            orphans = [
                key for (key,) in await (await conn.execute(_ORPHAN_FILES, params)).fetchall()
            ]
        return Purged(len(ended) + len(keys) + len(orphans), keys + orphans)

    async def purge_audit(self, before: datetime, limit: int) -> int:
        async with self._transaction() as conn:
            return (await conn.execute(_AUDIT, {"before": before, "limit": limit})).rowcount

    async def purge_ledger(self, before: datetime, limit: int) -> int:
        async with self._transaction() as conn:
            entries = await conn.execute(_LEDGER, {"before": before, "limit": limit})
            days = await conn.execute(_SPEND_DAYS, {"day": before.date()})
            return entries.rowcount + days.rowcount

    async def table_counts(self) -> dict[str, int]:
        async with self._transaction() as conn:
            names = [name for (name,) in await (await conn.execute(_TABLE_NAMES)).fetchall()]
            counts = {}
            for table in names:
                cursor = await conn.execute(f'SELECT count(*) FROM "{table}"')  # noqa: S608
                row = await cursor.fetchone()
                counts[table] = int(row[0]) if row else 0
            return counts
