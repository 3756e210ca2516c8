"""The façades' tables in the PostgreSQL store: a mixin of
:class:`gpugate.store.postgres.PostgresStore`.

A runner's claim takes the oldest runnable batch with ``FOR UPDATE SKIP LOCKED``, so replicas
claiming at once get different batches; a finished item and its count are one transaction.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpugate.errors import StoreError
from gpugate.store import facade_base as sql
from gpugate.store.facade_base import BatchItem, BatchRecord, FileRecord, NewBatch

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    import psycopg
    from psycopg.rows import TupleRow

    from gpugate.clock import Clock

    Connection = psycopg.AsyncConnection[TupleRow]

_CLAIM = sql.CLAIM_BATCH.format(lock="FOR UPDATE SKIP LOCKED")


class PostgresFacade:
    """The :class:`gpugate.store.facade_base.FacadeStore` methods of PostgreSQL."""

    _clock: Clock

    if TYPE_CHECKING:

        def _transaction(
            self, *, single: bool = False
        ) -> AbstractAsyncContextManager[Connection]: ...

    async def _one(self, statement: str, params: dict[str, Any]) -> TupleRow | None:
        async with self._transaction(single=True) as conn:
            return await (await conn.execute(statement, params)).fetchone()

    async def create_file(self, record: FileRecord) -> FileRecord:
        async with self._transaction(single=True) as conn:
            await conn.execute(sql.INSERT_FILE, _fields(record))
        return record

    async def get_file(self, file_id: str) -> FileRecord | None:
        row = await self._one(sql.SELECT_FILE, {"id": file_id})
        return None if row is None else _file(row)

    async def create_batch(self, new: NewBatch) -> BatchRecord:
        params = {
            **_fields(new),
            "metadata": None if new.metadata is None else json.dumps(new.metadata),
            "now": self._clock.now(),
        }
        row = await self._one(sql.INSERT_BATCH, params)
        if row is None:
            raise StoreError("the batch insert returned no row")
        return _batch(row)

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        row = await self._one(sql.SELECT_BATCH, {"id": batch_id})
        return None if row is None else _batch(row)

    async def claim_batch(
        self, owner: str, *, lease_s: float, takeover: bool = False
    ) -> BatchRecord | None:
        now = self._clock.now()
        params = {
            "owner": owner,
            "now": now,
            "until": now + timedelta(seconds=lease_s),
            "takeover": takeover,
        }
        row = await self._one(_CLAIM, params)
        return None if row is None else _batch(row)

    async def extend_batch_lease(self, batch_id: str, owner: str, *, lease_s: float) -> bool:
        until = self._clock.now() + timedelta(seconds=lease_s)
        async with self._transaction(single=True) as conn:
            cursor = await conn.execute(
                sql.EXTEND_BATCH, {"id": batch_id, "owner": owner, "until": until}
            )
            return cursor.rowcount == 1

    async def record_batch_item(self, batch_id: str, item: BatchItem) -> bool:
        params = {
            "id": batch_id,
            "line": item.line,
            "custom_id": item.custom_id,
            "ok": item.ok,
            "output": json.dumps(item.output, ensure_ascii=False, separators=(",", ":")),
        }
        counts = {"id": batch_id, "done": int(item.ok), "bad": int(not item.ok)}
        async with self._transaction() as conn:
            if (await conn.execute(sql.INSERT_ITEM, params)).rowcount != 1:
                return False
            await conn.execute(sql.COUNT_ITEM, counts)
            return True

    async def batch_items(self, batch_id: str) -> list[BatchItem]:
        async with self._transaction(single=True) as conn:
            rows = await (await conn.execute(sql.SELECT_ITEMS, {"id": batch_id})).fetchall()
        return [BatchItem(line, cid, ok, json.loads(out)) for line, cid, ok, out in rows]

    async def cancel_batch(self, batch_id: str) -> BatchRecord | None:
        params = {"id": batch_id, "now": self._clock.now()}
        async with self._transaction() as conn:
            row = await (await conn.execute(sql.CANCEL_BATCH, params)).fetchone()
            if row is None:
                row = await (await conn.execute(sql.SELECT_BATCH, params)).fetchone()
        return None if row is None else _batch(row)

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
            "now": self._clock.now(),
        }
        row = await self._one(sql.FINISH_BATCH, params)
        return None if row is None else _batch(row)

    async def break_batch(self, batch_id: str, owner: str, *, error: dict[str, Any]) -> int | None:
        params = {"id": batch_id, "owner": owner, "error": json.dumps(error, separators=(",", ":"))}
        row = await self._one(sql.BREAK_BATCH, params)
        return None if row is None else int(row[0])


def _fields(record: FileRecord | NewBatch) -> dict[str, Any]:
    return {name: getattr(record, name) for name in type(record).__slots__}


def _utc(moment: datetime | None) -> datetime | None:
    return None if moment is None else moment.astimezone(UTC)


def _file(row: TupleRow) -> FileRecord:
    file_id, purpose, filename, size, blob_key, created_at = row
    return FileRecord(file_id, purpose, filename, size, blob_key, created_at.astimezone(UTC))


def _batch(row: TupleRow) -> BatchRecord:
    return sql.batch_from_row(row, _utc)
