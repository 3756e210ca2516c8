"""The OpenAI Batch API façade: files and batches in OpenAI's shapes (issue 9).

``POST /v1/files`` stores an upload (purpose ``batch``) in the blob store; ``POST /v1/batches``
validates its JSONL lines — ``{custom_id, method: POST, url: <the batch's endpoint>, body}``,
``custom_id`` unique, ``body.model`` a string — and stores the batch ``in_progress``; a
:class:`~gpugate.services.batch_runner.BatchRunner` runs it. Bad input is a 400 naming the line,
and nothing is stored.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpugate.adapters.blobs import BlobStore
from gpugate.clock import Clock
from gpugate.config.paths import format_path
from gpugate.config.untrusted import checked_json
from gpugate.errors import BadRequest, BatchNotFound, FileNotFound
from gpugate.store.facade_base import BatchRecord, FacadeStore, FileRecord, NewBatch

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
WINDOWS = {"24h": timedelta(hours=24)}
PURPOSES = ("batch",)


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One validated input line: its position, ``custom_id``, target and body."""

    line: int
    custom_id: str
    url: str
    body: dict[str, Any]
    problem: str | None = None  # text no store keeps (only from a file stored before the check)


def parse_lines(data: bytes, endpoint: str, *, unsafe_text: bool = False) -> list[BatchLine]:
    """The lines of a batch input file; BadRequest naming the first bad line (1-based).

    Text no store keeps alike (a NUL, a lone surrogate) is refused too — unless
    ``unsafe_text``: the runner reading a file stored before that check keeps such a line with
    its ``problem``, to fail that line alone."""
    lines: list[BatchLine] = []
    seen: set[str] = set()
    for number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            doc, problem = checked_json(raw)
        except ValueError as exc:
            raise BadRequest(f"line {number} is not JSON: {exc}") from exc
        unsafe = None
        if problem is not None:  # a NUL or a lone surrogate: refused alike on both backends
            unsafe = f"{format_path(problem.path) or 'the line'}: {problem.message}"
            if not unsafe_text:
                raise BadRequest(f"line {number}: {unsafe}")
        if not isinstance(doc, dict):
            raise BadRequest(f"line {number}: expected a JSON object")
        custom_id, body = doc.get("custom_id"), doc.get("body")
        if not isinstance(custom_id, str) or not custom_id:
            raise BadRequest(f"line {number}: `custom_id` must be a non-empty string")
        if custom_id in seen:
            raise BadRequest(f"line {number}: `custom_id` {custom_id!r} is used twice")
        if doc.get("method") != "POST" or doc.get("url") != endpoint:
            raise BadRequest(f"line {number}: `method` must be POST and `url` {endpoint}")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise BadRequest(f"line {number}: `body` must be an object with a `model`")
        seen.add(custom_id)
        lines.append(BatchLine(len(lines), custom_id, endpoint, body, unsafe))
    if not lines:
        raise BadRequest("the input file holds no request lines")
    return lines


def _errors(batch: BatchRecord) -> dict[str, Any] | None:
    """A failed batch's reason, as OpenAI lists a batch's errors."""
    if batch.status != "failed" or batch.error is None:
        return None
    entry = {"code": batch.error.get("code"), "message": batch.error.get("message")}
    return {"object": "list", "data": [{**entry, "param": None, "line": None}]}


def _epoch(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


def file_view(record: FileRecord) -> dict[str, Any]:
    """A file as OpenAI shows one."""
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": _epoch(record.created_at),
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def batch_view(batch: BatchRecord) -> dict[str, Any]:
    """A batch as OpenAI shows one."""
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": _errors(batch),
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": _epoch(batch.created_at),
        "in_progress_at": _epoch(batch.in_progress_at),
        "expires_at": _epoch(batch.expires_at),
        "finalizing_at": _epoch(batch.finalizing_at),
        "completed_at": _epoch(batch.completed_at),
        "failed_at": _epoch(batch.failed_at),
        "expired_at": _epoch(batch.finalizing_at) if batch.status == "expired" else None,
        "cancelling_at": _epoch(batch.cancelling_at),
        "cancelled_at": _epoch(batch.cancelled_at),
        "request_counts": {
            "total": batch.total,
            "completed": batch.completed,
            "failed": batch.failed,
        },
        "metadata": batch.metadata,
    }


class BatchFiles:
    """The files of the Batch API: bytes in the blob store, their records in the store. The
    runner reads and writes through these, the API through :class:`Batches`."""

    def __init__(self, store: FacadeStore, blobs: BlobStore, clock: Clock) -> None:
        self._store = store
        self._blobs = blobs
        self._clock = clock

    async def store_file(self, filename: str, purpose: str, data: bytes) -> FileRecord:
        """Bytes into the blob store, then the file's record (any purpose)."""
        file_id = f"file-{secrets.token_hex(12)}"
        key = f"files/{file_id}"
        await self._blobs.put(key, data, content_type="application/jsonl")
        record = FileRecord(file_id, purpose, filename, len(data), key, self._clock.now())
        return await self._store.create_file(record)

    async def get_file(self, file_id: str) -> FileRecord:
        record = await self._store.get_file(file_id)
        if record is None:
            raise FileNotFound(f"no file {file_id!r}")
        return record

    async def file_content(self, file_id: str) -> bytes:
        return await self._blobs.get((await self.get_file(file_id)).blob_key)


class Batches:
    """Files and batches: create, read, cancel; running is the runner's, which ``wake`` (a
    batch was created) and ``cancel`` (one was cancelled) tell."""

    def __init__(
        self,
        store: FacadeStore,
        files: BatchFiles,
        clock: Clock,
        *,
        wake: Callable[[], None] | None = None,
        cancel: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self.files = files
        self._clock = clock
        self._wake = wake
        self._cancelled = cancel

    async def create_file(self, filename: str, purpose: str, data: bytes) -> FileRecord:
        if purpose not in PURPOSES:
            raise BadRequest(f"purpose must be one of {', '.join(PURPOSES)}; got {purpose!r}")
        return await self.files.store_file(filename, purpose, data)

    async def store_file(self, filename: str, purpose: str, data: bytes) -> FileRecord:
        """Bytes into the blob store, then the file's record (any purpose)."""
        return await self.files.store_file(filename, purpose, data)

    async def get_file(self, file_id: str) -> FileRecord:
        return await self.files.get_file(file_id)

    async def file_content(self, file_id: str) -> bytes:
        return await self.files.file_content(file_id)

    async def create_batch(self, body: dict[str, Any]) -> BatchRecord:
        endpoint, window = body.get("endpoint"), body.get("completion_window", "24h")
        if endpoint not in ENDPOINTS:
            raise BadRequest(f"endpoint must be one of {', '.join(ENDPOINTS)}")
        if window not in WINDOWS:
            raise BadRequest(f"completion_window must be one of {', '.join(WINDOWS)}")
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise BadRequest("metadata must be an object")
        input_id = body.get("input_file_id")
        inline = body.get("input")
        if inline is not None:  # our extension: the lines themselves, instead of a file
            if input_id is not None:
                raise BadRequest("give input_file_id or input (the lines inline), not both")
            input_id, lines = await self._inline_file(inline, str(endpoint))
        elif not isinstance(input_id, str):
            raise BadRequest("input_file_id must be a file id (or give the lines as input)")
        else:
            lines = parse_lines(await self.files.file_content(input_id), str(endpoint))
        now = self._clock.now()
        new = NewBatch(
            f"batch_{secrets.token_hex(12)}",
            str(endpoint),
            input_id,
            str(window),
            len(lines),
            metadata,
            now + WINDOWS[str(window)],
        )
        batch = await self._store.create_batch(new)
        if self._wake is not None:
            self._wake()
        return batch

    async def _inline_file(self, lines: Any, endpoint: str) -> tuple[str, list[BatchLine]]:
        """``input``: a list of Batch-format line objects, stored as the batch's input file
        (checked like an uploaded one first); the file's id and its parsed lines."""
        if not isinstance(lines, list) or not lines:
            raise BadRequest("input must be a non-empty list of {custom_id, method, url, body}")
        data = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
        parsed = parse_lines(data, endpoint)
        return (await self.store_file("inline.jsonl", "batch", data)).id, parsed

    async def get_batch(self, batch_id: str) -> BatchRecord:
        batch = await self._store.get_batch(batch_id)
        if batch is None:
            raise BatchNotFound(f"no batch {batch_id!r}")
        return batch

    async def cancel_batch(self, batch_id: str) -> BatchRecord:
        batch = await self._store.cancel_batch(batch_id)
        if batch is None:
            raise BatchNotFound(f"no batch {batch_id!r}")
        if self._cancelled is not None:
            self._cancelled(batch_id)
        return batch

    def __repr__(self) -> str:
        return f"<Batches files={self.files!r}>"
