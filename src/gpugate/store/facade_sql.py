"""The façades' tables (:mod:`gpugate.store.facade_base`), once for both backends.

A runner's claim takes the oldest runnable batch (PostgreSQL: ``FOR UPDATE SKIP LOCKED``, so
replicas claiming at once get different batches); a finished item and its count are one
transaction.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpugate.store.dialect import sql
from gpugate.store.facade_base import (
    BATCH_TIMES,
    BatchItem,
    BatchRecord,
    FileRecord,
    NewBatch,
    batch_from_row,
)
from gpugate.store.tx import Driven, count, first, one, rows, run

if TYPE_CHECKING:
    from gpugate.store.tx import Row, Tx

_BATCH = (
    "id, endpoint, input_file_id, completion_window, status, total, completed, failed, "
    "output_file_id, error_file_id, metadata, owner, lease_expires_at, "
    + ", ".join(BATCH_TIMES)
    + ", breaks, error"
)
_INSERT_FILE = sql("""
INSERT INTO batch_files (id, purpose, filename, bytes, blob_key, created_at)
VALUES (:id, :purpose, :filename, :bytes, :blob_key, :created_at)""")
_FILE = sql("""
SELECT id, purpose, filename, bytes, blob_key, created_at FROM batch_files WHERE id = :id""")
_INSERT_BATCH = sql(
    """
INSERT INTO batches (id, endpoint, input_file_id, completion_window, status, total, metadata,
                     created_at, in_progress_at, expires_at)
VALUES (:id, :endpoint, :input_file_id, :completion_window, 'in_progress', :total, :metadata,
        :now, :now, :expires_at)
RETURNING {batch}""",
    batch=_BATCH,
)
_BATCH_BY_ID = sql("SELECT {batch} FROM batches WHERE id = :id", batch=_BATCH)
_CLAIM = sql(
    """
UPDATE batches SET owner = :owner, lease_expires_at = :until
WHERE id = (
    SELECT id FROM batches
    WHERE status IN ('in_progress', 'finalizing', 'cancelling')
      AND (owner IS NULL OR (owner <> :owner AND (:takeover OR lease_expires_at <= :now)))
    ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING {batch}""",
    batch=_BATCH,
)
_EXTEND = sql("UPDATE batches SET lease_expires_at = :until WHERE id = :id AND owner = :owner")
_INSERT_ITEM = sql("""
INSERT INTO batch_items (batch_id, line, custom_id, ok, output)
VALUES (:id, :line, :custom_id, :ok, :output)
ON CONFLICT (batch_id, line) DO NOTHING""")
_COUNT_ITEM = sql(
    "UPDATE batches SET completed = completed + :done, failed = failed + :bad WHERE id = :id"
)
_ITEMS = sql(
    "SELECT line, custom_id, ok, output FROM batch_items WHERE batch_id = :id ORDER BY line"
)
_CANCEL = sql(
    """
UPDATE batches SET status = 'cancelling', cancelling_at = :now
WHERE id = :id AND status = 'in_progress'
RETURNING {batch}""",
    batch=_BATCH,
)
_FINISH = sql(
    """
UPDATE batches SET status = :status, output_file_id = :output_file_id,
    error_file_id = :error_file_id, owner = NULL, lease_expires_at = NULL,
    finalizing_at = :now,
    completed_at = CASE WHEN :status = 'completed' THEN :now ELSE completed_at END,
    cancelled_at = CASE WHEN :status = 'cancelled' THEN :now ELSE cancelled_at END,
    failed_at = CASE WHEN :status = 'failed' THEN :now ELSE failed_at END
WHERE id = :id AND owner = :owner
RETURNING {batch}""",
    batch=_BATCH,
)
_BREAK = sql("""
UPDATE batches SET breaks = breaks + 1, error = :error, owner = NULL, lease_expires_at = NULL
WHERE id = :id AND owner = :owner
RETURNING breaks""")


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _fields(record: FileRecord | NewBatch) -> dict[str, Any]:
    return {name: getattr(record, name) for name in type(record).__slots__}


def _record_item(params: dict[str, Any], counts: dict[str, Any]) -> Tx[bool]:
    if (yield from count(_INSERT_ITEM, params)) != 1:
        return False
    yield from run(_COUNT_ITEM, counts)
    return True


def _cancel(params: dict[str, Any]) -> Tx[Row | None]:
    row = yield from first(_CANCEL, params)
    return row if row is not None else (yield from first(_BATCH_BY_ID, params))


class FacadeSql(Driven):
    """The :class:`gpugate.store.facade_base.FacadeStore` methods."""

    def _batch(self, row: Row | None) -> BatchRecord | None:
        return None if row is None else batch_from_row(row, self._codec.opt_time)

    async def _batch_write(self, tx: Tx[Row | None]) -> BatchRecord | None:
        return self._batch(await self._transact(tx, single=True))

    async def create_file(self, record: FileRecord) -> FileRecord:
        await self._transact(run(_INSERT_FILE, _fields(record)), single=True)
        return record

    async def get_file(self, file_id: str) -> FileRecord | None:
        row = await self._query(first(_FILE, {"id": file_id}))
        if row is None:
            return None
        file_id, purpose, filename, size, blob_key, created_at = row
        return FileRecord(file_id, purpose, filename, size, blob_key, self._codec.time(created_at))

    async def create_batch(self, new: NewBatch) -> BatchRecord:
        params = _fields(new) | {"now": self._clock.now()}
        params["metadata"] = None if new.metadata is None else _json(new.metadata)
        batch = self._batch(await self._transact(one(_INSERT_BATCH, params), single=True))
        assert batch is not None
        return batch

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        return self._batch(await self._query(first(_BATCH_BY_ID, {"id": batch_id})))

    async def claim_batch(
        self, owner: str, *, lease_s: float, takeover: bool = False
    ) -> BatchRecord | None:
        now = self._clock.now()
        params = {"owner": owner, "now": now, "takeover": takeover}
        return await self._batch_write(
            first(_CLAIM, params | {"until": now + timedelta(seconds=lease_s)})
        )

    async def extend_batch_lease(self, batch_id: str, owner: str, *, lease_s: float) -> bool:
        until = self._clock.now() + timedelta(seconds=lease_s)
        params = {"id": batch_id, "owner": owner, "until": until}
        return await self._transact(count(_EXTEND, params), single=True) == 1

    async def record_batch_item(self, batch_id: str, item: BatchItem) -> bool:
        params = {"id": batch_id, "line": item.line, "custom_id": item.custom_id, "ok": item.ok}
        params["output"] = _json(item.output)
        counts = {"id": batch_id, "done": int(item.ok), "bad": int(not item.ok)}
        return await self._transact(_record_item(params, counts))

    async def batch_items(self, batch_id: str) -> list[BatchItem]:
        found = await self._query(rows(_ITEMS, {"id": batch_id}))
        return [BatchItem(line, cid, bool(ok), json.loads(out)) for line, cid, ok, out in found]

    async def cancel_batch(self, batch_id: str) -> BatchRecord | None:
        params = {"id": batch_id, "now": self._clock.now()}
        return self._batch(await self._transact(_cancel(params)))

    async def finish_batch(
        self,
        batch_id: str,
        owner: str,
        *,
        status: str,
        output_file_id: str | None,
        error_file_id: str | None,
    ) -> BatchRecord | None:
        params = {"id": batch_id, "owner": owner, "status": status, "now": self._clock.now()}
        params |= {"output_file_id": output_file_id, "error_file_id": error_file_id}
        return await self._batch_write(first(_FINISH, params))

    async def break_batch(self, batch_id: str, owner: str, *, error: dict[str, Any]) -> int | None:
        params = {"id": batch_id, "owner": owner, "error": _json(error)}
        row = await self._transact(first(_BREAK, params), single=True)
        return None if row is None else int(row[0])
