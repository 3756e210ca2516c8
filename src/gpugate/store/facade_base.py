"""What the façades keep in the store: the OpenAI Batch API's files and batches with their
finished items.

* A file is its metadata here and its bytes in the blob store (``blob_key``).
* A batch is owned by one runner at a time through a lease (``owner``, ``lease_expires_at``), so
  among replicas one runs it, and another takes it over when the owner goes quiet; a runner
  never claims a batch it owns already.
* Each finished item (one input line) is stored once: :meth:`FacadeStore.record_batch_item`
  inserts it and bumps ``completed`` or ``failed`` in the same transaction, and a second record
  of the same line changes nothing — so a batch resumed after a restart re-runs only the lines
  that have no item yet, and its counts stay exact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from datetime import datetime

RUNNABLE = ("in_progress", "finalizing", "cancelling")
"""The statuses of a batch that a runner still has work to do for."""

BATCH_TIMES = (
    "created_at",
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "cancelling_at",
    "cancelled_at",
    "expires_at",
)


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


def batch_from_row(row: Sequence[Any], to_time: Callable[[Any], datetime | None]) -> BatchRecord:
    """A row of :data:`BATCH_COLUMNS` as a record; ``to_time`` reads the driver's times."""
    (bid, endpoint, file_id, window, status, total, done, bad, out, err, meta, owner) = row[:12]
    lease, created, *rest = (to_time(value) for value in row[12 : 13 + len(BATCH_TIMES)])
    in_progress, finalizing, completed, failed, cancelling, cancelled, expires = rest
    breaks, error = row[-2:]
    assert created is not None, "a batch has its creation time"
    return BatchRecord(
        bid,
        endpoint,
        file_id,
        window,
        status,
        total,
        done,
        bad,
        out,
        err,
        None if meta is None else json.loads(meta),
        owner,
        lease,
        created,
        in_progress,
        finalizing,
        completed,
        failed,
        cancelling,
        cancelled,
        expires,
        breaks,
        None if error is None else json.loads(error),
    )


class FacadeStore(Protocol):
    """The façades' part of :class:`gpugate.store.Store`."""

    async def create_file(self, record: FileRecord) -> FileRecord:
        """Store a file's metadata (its bytes are in the blob store already)."""
        ...

    async def get_file(self, file_id: str) -> FileRecord | None:
        """One file's metadata, None when there is no such file."""
        ...

    async def create_batch(self, new: NewBatch) -> BatchRecord:
        """Store a new batch, ``in_progress`` and owned by nobody."""
        ...

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        """One batch, None when there is no such batch."""
        ...

    async def claim_batch(
        self, owner: str, *, lease_s: float, takeover: bool = False
    ) -> BatchRecord | None:
        """The oldest runnable batch nobody holds (or whose lease expired, or, with
        ``takeover``, held by anyone but ``owner``), now held by ``owner`` for ``lease_s``."""
        ...

    async def extend_batch_lease(self, batch_id: str, owner: str, *, lease_s: float) -> bool:
        """Keep holding the batch; False when ``owner`` no longer holds it."""
        ...

    async def record_batch_item(self, batch_id: str, item: BatchItem) -> bool:
        """Store a finished line once, bumping the batch's counts; False if it was stored."""
        ...

    async def batch_items(self, batch_id: str) -> list[BatchItem]:
        """The batch's finished lines, in line order."""
        ...

    async def cancel_batch(self, batch_id: str) -> BatchRecord | None:
        """``in_progress`` → ``cancelling``; any other status is left as it is. None when
        there is no such batch."""
        ...

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
        ...

    async def break_batch(self, batch_id: str, owner: str, *, error: dict[str, Any]) -> int | None:
        """A run of the batch broke: count it (``breaks + 1``), keep ``error`` ``{code,
        message}`` and let go of the batch so a runner resumes it at once; the new count, or
        None when ``owner`` no longer holds it."""
        ...
