"""The façades' tables in the SQLite store: a mixin of :class:`gpugate.store.sqlite.SqliteStore`.

Each method is one hop to the store's thread; a finished item and its count are one
``BEGIN IMMEDIATE`` transaction.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from gpugate.store import facade_base as sql
from gpugate.store.facade_base import BatchItem, BatchRecord, FileRecord, NewBatch
from gpugate.store.sqlite_codec import json_text, text_time, time_text

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable

    from gpugate.clock import Clock

T = TypeVar("T")

_S = sql.sqlite_style
_CLAIM = _S(sql.CLAIM_BATCH.format(lock=""))
_CANCEL_BATCH = _S(sql.CANCEL_BATCH)
_COUNT_ITEM = _S(sql.COUNT_ITEM)
_EXTEND_BATCH = _S(sql.EXTEND_BATCH)
_FINISH_BATCH = _S(sql.FINISH_BATCH)
_BREAK_BATCH = _S(sql.BREAK_BATCH)
_INSERT_BATCH = _S(sql.INSERT_BATCH)
_INSERT_FILE = _S(sql.INSERT_FILE)
_INSERT_ITEM = _S(sql.INSERT_ITEM)
_SELECT_BATCH = _S(sql.SELECT_BATCH)
_SELECT_FILE = _S(sql.SELECT_FILE)
_SELECT_ITEMS = _S(sql.SELECT_ITEMS)


class SqliteFacade:
    """The :class:`gpugate.store.facade_base.FacadeStore` methods of the SQLite store."""

    _clock: Clock

    if TYPE_CHECKING:

        async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _write(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

    async def create_file(self, record: FileRecord) -> FileRecord:
        params = {**_fields(record), "created_at": time_text(record.created_at)}
        await self._write(lambda conn: conn.execute(_INSERT_FILE, params))
        return record

    async def get_file(self, file_id: str) -> FileRecord | None:
        def work(conn: sqlite3.Connection) -> FileRecord | None:
            row = conn.execute(_SELECT_FILE, {"id": file_id}).fetchone()
            return None if row is None else _file(row)

        return await self._read(work)

    async def create_batch(self, new: NewBatch) -> BatchRecord:
        params = {
            **_fields(new),
            "metadata": None if new.metadata is None else json_text(new.metadata),
            "expires_at": time_text(new.expires_at),
            "now": time_text(self._clock.now()),
        }
        return await self._write(
            lambda conn: _batch(conn.execute(_INSERT_BATCH, params).fetchone())
        )

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        def work(conn: sqlite3.Connection) -> BatchRecord | None:
            row = conn.execute(_SELECT_BATCH, {"id": batch_id}).fetchone()
            return None if row is None else _batch(row)

        return await self._read(work)

    async def claim_batch(
        self, owner: str, *, lease_s: float, takeover: bool = False
    ) -> BatchRecord | None:
        now = self._clock.now()
        params = {
            "owner": owner,
            "now": time_text(now),
            "until": time_text(now + timedelta(seconds=lease_s)),
            "takeover": int(takeover),
        }

        def work(conn: sqlite3.Connection) -> BatchRecord | None:
            row = conn.execute(_CLAIM, params).fetchone()
            return None if row is None else _batch(row)

        return await self._write(work)

    async def extend_batch_lease(self, batch_id: str, owner: str, *, lease_s: float) -> bool:
        until = time_text(self._clock.now() + timedelta(seconds=lease_s))
        params = {"id": batch_id, "owner": owner, "until": until}
        return await self._write(lambda conn: conn.execute(_EXTEND_BATCH, params).rowcount == 1)

    async def record_batch_item(self, batch_id: str, item: BatchItem) -> bool:
        params = {
            "id": batch_id,
            "line": item.line,
            "custom_id": item.custom_id,
            "ok": int(item.ok),
            "output": json_text(item.output),
        }
        counts = {"id": batch_id, "done": int(item.ok), "bad": int(not item.ok)}

        def work(conn: sqlite3.Connection) -> bool:
            if conn.execute(_INSERT_ITEM, params).rowcount != 1:
                return False
            conn.execute(_COUNT_ITEM, counts)
            return True

        return await self._write(work)

    async def batch_items(self, batch_id: str) -> list[BatchItem]:
        def work(conn: sqlite3.Connection) -> list[BatchItem]:
            rows = conn.execute(_SELECT_ITEMS, {"id": batch_id}).fetchall()
            return [BatchItem(line, cid, bool(ok), json.loads(out)) for line, cid, ok, out in rows]

        return await self._read(work)

    async def cancel_batch(self, batch_id: str) -> BatchRecord | None:
        params = {"id": batch_id, "now": time_text(self._clock.now())}

        def work(conn: sqlite3.Connection) -> BatchRecord | None:
            row = conn.execute(_CANCEL_BATCH, params).fetchone()
            if row is None:
                row = conn.execute(_SELECT_BATCH, params).fetchone()
            return None if row is None else _batch(row)

        return await self._write(work)

    async def finish_batch(
        self,
        batch_id: str,
        owner: str,
        *,
        status: str,
        output_file_id: str | None,
        error_file_id: str | None,
    ) -> BatchRecord | None:
        params = {
            "id": batch_id,
            "owner": owner,
            "status": status,
            "output_file_id": output_file_id,
            "error_file_id": error_file_id,
            "now": time_text(self._clock.now()),
        }

        def work(conn: sqlite3.Connection) -> BatchRecord | None:
            row = conn.execute(_FINISH_BATCH, params).fetchone()
            return None if row is None else _batch(row)

        return await self._write(work)

    async def break_batch(self, batch_id: str, owner: str, *, error: dict[str, Any]) -> int | None:
        params = {"id": batch_id, "owner": owner, "error": json_text(error)}

        def work(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(_BREAK_BATCH, params).fetchone()
            return None if row is None else int(row[0])

        return await self._write(work)


def _fields(record: FileRecord | NewBatch) -> dict[str, Any]:
    return {name: getattr(record, name) for name in type(record).__slots__}


def _file(row: tuple[Any, ...]) -> FileRecord:
    file_id, purpose, filename, size, blob_key, created_at = row
    return FileRecord(file_id, purpose, filename, size, blob_key, text_time(created_at))


def _time(value: str | None) -> datetime | None:
    return None if value is None else text_time(value)


def _batch(row: tuple[Any, ...]) -> BatchRecord:
    return sql.batch_from_row(row, _time)
