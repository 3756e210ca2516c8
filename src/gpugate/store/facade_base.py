"""What the façades keep in the store: the OpenAI Batch API's files and batches with their
finished items; the values and the methods, once for both backends.

* A file is its metadata here and its bytes in the blob store (``blob_key``).
* A batch is owned by one runner at a time through a lease (``owner``, ``lease_expires_at``), so
  among replicas one runs it, and another takes it over when the owner goes quiet; a runner
  never claims a batch it owns already. A claim takes the oldest runnable batch (PostgreSQL:
  ``FOR UPDATE SKIP LOCKED``, so replicas claiming at once get different batches).
* Each finished item (one input line) is stored once: :meth:`FacadeStore.record_batch_item`
  inserts it and bumps ``completed`` or ``failed`` in the same transaction, and a second record
  of the same line changes nothing — so a batch resumed after a restart re-runs only the lines
  that have no item yet, and its counts stay exact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from gpugate.store.dialect import sql
from gpugate.store.tx import Driven, count, first, one, read, rows, run, values

if TYPE_CHECKING:
    from gpugate.store.tx import Codec, Row, Tx


@dataclass(frozen=True, slots=True)
class FileRecord:
    """An uploaded (or gateway-written) file; its bytes are in the blob store."""

    id: str
    purpose: str
    filename: str
    bytes: int
    blob_key: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class NewBatch:
    """A validated batch, before it is stored."""

    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    total: int
    metadata: dict[str, Any] | None
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """A stored batch: what ``GET /v1/batches/{id}`` shows, plus who runs it."""

    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    total: int
    completed: int
    failed: int
    output_file_id: str | None
    error_file_id: str | None
    metadata: dict[str, Any] | None
    owner: str | None
    lease_expires_at: datetime | None
    created_at: datetime
    in_progress_at: datetime | None
    finalizing_at: datetime | None
    completed_at: datetime | None
    failed_at: datetime | None
    cancelling_at: datetime | None
    cancelled_at: datetime | None
    expires_at: datetime | None
    breaks: int = 0  # runs that broke (an exception, not a lost lease): capped, then failed
    error: dict[str, Any] | None = None  # the last break's {code, message}

    @property
    def terminal(self) -> bool:
        return self.status in ("completed", "failed", "expired", "cancelled")


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One finished line of a batch: its output line (OpenAI's shape) and whether it failed."""

    line: int
    custom_id: str
    ok: bool
    output: dict[str, Any]


_BATCH = ", ".join(column.name for column in fields(BatchRecord))
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


def _loads(_: Codec, text: str) -> Any:
    return json.loads(text)  # text on both backends (the columns are not jsonb)


def _batch(c: Codec, row: Row | None) -> BatchRecord | None:
    return None if row is None else read(c, BatchRecord, row, metadata=_loads, error=_loads)


def _record_item(params: dict[str, Any], counts: dict[str, Any]) -> Tx[bool]:
    if (yield from count(_INSERT_ITEM, params)) != 1:
        return False
    yield from run(_COUNT_ITEM, counts)
    return True


def _cancel(params: dict[str, Any]) -> Tx[Row | None]:
    row = yield from first(_CANCEL, params)
    return row if row is not None else (yield from first(_BATCH_BY_ID, params))


class FacadeStore(Driven, Protocol):
    """The façades' part of :class:`gpugate.store.Store`."""

    async def create_file(self, record: FileRecord) -> FileRecord:
        """Store a file's metadata (its bytes are in the blob store already)."""
        await self._transact(run(_INSERT_FILE, values(record)), single=True)
        return record

    async def get_file(self, file_id: str) -> FileRecord | None:
        """One file's metadata, None when there is no such file."""
        row = await self._query(first(_FILE, {"id": file_id}))
        return None if row is None else read(self._codec, FileRecord, row)

    async def create_batch(self, new: NewBatch) -> BatchRecord:
        """Store a new batch, ``in_progress`` and owned by nobody."""
        params = values(new) | {"now": self._clock.now()}
        params["metadata"] = None if new.metadata is None else _json(new.metadata)
        batch = _batch(self._codec, await self._transact(one(_INSERT_BATCH, params), single=True))
        assert batch is not None
        return batch

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        """One batch, None when there is no such batch."""
        return _batch(self._codec, await self._query(first(_BATCH_BY_ID, {"id": batch_id})))

    async def claim_batch(
        self, owner: str, *, lease_s: float, takeover: bool = False
    ) -> BatchRecord | None:
        """The oldest runnable batch nobody holds (or whose lease expired, or, with
        ``takeover``, held by anyone but ``owner``), now held by ``owner`` for ``lease_s``."""
        now = self._clock.now()
        params = {"owner": owner, "now": now, "takeover": takeover}
        params["until"] = now + timedelta(seconds=lease_s)
        return _batch(self._codec, await self._transact(first(_CLAIM, params), single=True))

    async def extend_batch_lease(self, batch_id: str, owner: str, *, lease_s: float) -> bool:
        """Keep holding the batch; False when ``owner`` no longer holds it."""
        until = self._clock.now() + timedelta(seconds=lease_s)
        params = {"id": batch_id, "owner": owner, "until": until}
        return await self._transact(count(_EXTEND, params), single=True) == 1

    async def record_batch_item(self, batch_id: str, item: BatchItem) -> bool:
        """Store a finished line once, bumping the batch's counts; False if it was stored."""
        params = {"id": batch_id, "line": item.line, "custom_id": item.custom_id, "ok": item.ok}
        params["output"] = _json(item.output)
        counts = {"id": batch_id, "done": int(item.ok), "bad": int(not item.ok)}
        return await self._transact(_record_item(params, counts))

    async def batch_items(self, batch_id: str) -> list[BatchItem]:
        """The batch's finished lines, in line order."""
        found = await self._query(rows(_ITEMS, {"id": batch_id}))
        return [read(self._codec, BatchItem, row, output=_loads) for row in found]

    async def cancel_batch(self, batch_id: str) -> BatchRecord | None:
        """``in_progress`` → ``cancelling``; any other status is left as it is. None when
        there is no such batch."""
        params = {"id": batch_id, "now": self._clock.now()}
        return _batch(self._codec, await self._transact(_cancel(params)))

    async def finish_batch(
        self,
        batch_id: str,
        owner: str,
        *,
        status: str,
        output_file_id: str | None,
        error_file_id: str | None,
    ) -> BatchRecord | None:
        """Set the final ``status`` (``completed``, ``cancelled``, ``expired`` or ``failed``)
        with its files and let go of the batch; None when ``owner`` no longer holds it."""
        params = {"id": batch_id, "owner": owner, "status": status, "now": self._clock.now()}
        params |= {"output_file_id": output_file_id, "error_file_id": error_file_id}
        return _batch(self._codec, await self._transact(first(_FINISH, params), single=True))

    async def break_batch(self, batch_id: str, owner: str, *, error: dict[str, Any]) -> int | None:
        """A run of the batch broke: count it (``breaks + 1``), keep ``error`` ``{code,
        message}`` and let go of the batch so a runner resumes it at once; the new count, or
        None when ``owner`` no longer holds it."""
        params = {"id": batch_id, "owner": owner, "error": _json(error)}
        row = await self._transact(first(_BREAK, params), single=True)
        return None if row is None else int(row[0])
