"""The retention purge of the SQLite store (:mod:`gpugate.store.retention`): a mixin of
:class:`gpugate.store.sqlite.SqliteStore`; each call is one ``BEGIN IMMEDIATE`` transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from gpugate.store.retention import (
    BATCH_ENDED_AT,
    ENDED_BATCHES,
    NAMED_FILES,
    TERMINAL_JOBS,
    Purged,
)
from gpugate.store.sqlite_codec import time_text

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable
    from datetime import datetime

T = TypeVar("T")

_JOBS = f"""
DELETE FROM jobs WHERE id IN (
    SELECT id FROM jobs INDEXED BY jobs_finished
    WHERE finished_at < :before AND state IN {TERMINAL_JOBS}
    ORDER BY finished_at LIMIT :limit)
RETURNING input_ref, result_ref"""  # noqa: S608 -- constants only; values are bound
_BATCHES = f"""
DELETE FROM batches WHERE id IN (
    SELECT id FROM batches WHERE status IN {ENDED_BATCHES} AND {BATCH_ENDED_AT} < :before
    LIMIT :limit)
RETURNING input_file_id, output_file_id, error_file_id"""  # noqa: S608
_ORPHAN_FILES = f"""
DELETE FROM batch_files WHERE id IN (
    SELECT id FROM batch_files WHERE created_at < :before AND id NOT IN ({NAMED_FILES})
    LIMIT :limit)
RETURNING blob_key"""  # noqa: S608
_AUDIT = """
DELETE FROM audit_events WHERE id IN (
    SELECT id FROM audit_events WHERE at < :before ORDER BY id LIMIT :limit)"""
_LEDGER = """
DELETE FROM ledger WHERE id IN (
    SELECT id FROM ledger WHERE state <> 'reserved' AND at < :before ORDER BY id LIMIT :limit)"""
_SPEND_DAYS = "DELETE FROM spend_days WHERE day < :day"
_TABLE_NAMES = (
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
)


class SqliteRetention:
    """The :class:`gpugate.store.retention.RetentionStore` methods of the SQLite store."""

    if TYPE_CHECKING:

        async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _write(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

    async def purge_jobs(self, finished_before: datetime, limit: int) -> Purged:
        params = {"before": time_text(finished_before), "limit": limit}

        def work(conn: sqlite3.Connection) -> Purged:
            rows = conn.execute(_JOBS, params).fetchall()
            return Purged(len(rows), [key for row in rows for key in row if key])

        return await self._write(work)

    async def purge_batches(self, ended_before: datetime, limit: int) -> Purged:
        params = {"before": time_text(ended_before), "limit": limit}

        def work(conn: sqlite3.Connection) -> Purged:
            ended = conn.execute(_BATCHES, params).fetchall()
            files = sorted({file_id for row in ended for file_id in row if file_id})
            keys = []
            if files:
                marks = ", ".join("?" * len(files))
                sql = (
                    f"DELETE FROM batch_files WHERE id IN ({marks})"  # noqa: S608 -- marks only
                    f" AND id NOT IN ({NAMED_FILES}) RETURNING blob_key"
                )
                keys = [key for (key,) in conn.execute(sql, files).fetchall()]
            orphans = [key for (key,) in conn.execute(_ORPHAN_FILES, params).fetchall()]
            return Purged(len(ended) + len(keys) + len(orphans), keys + orphans)

        return await self._write(work)

    async def purge_audit(self, before: datetime, limit: int) -> int:
        params = {"before": time_text(before), "limit": limit}
        return await self._write(lambda conn: conn.execute(_AUDIT, params).rowcount)

    async def purge_ledger(self, before: datetime, limit: int) -> int:
        params = {"before": time_text(before), "limit": limit}
        day = {"day": before.date().isoformat()}

        def work(conn: sqlite3.Connection) -> int:
            return conn.execute(_LEDGER, params).rowcount + conn.execute(_SPEND_DAYS, day).rowcount

        return await self._write(work)

    async def table_counts(self) -> dict[str, int]:
        def work(conn: sqlite3.Connection) -> dict[str, int]:
            names = [name for (name,) in conn.execute(_TABLE_NAMES).fetchall()]
            return {
                table: conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]  # noqa: S608
                for table in names
            }

        return await self._read(work)
