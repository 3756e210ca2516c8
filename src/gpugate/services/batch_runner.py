"""Runs Batch API batches: each line through the gateway's own proxy path, bounded concurrency.

A runner holds a batch through a store lease (renewed every third of ``lease_s``); among
replicas one runs a batch, and another takes it over when the holder goes quiet (on SQLite, one
process, the runner takes every batch back at start-up). Each line goes to ``Proxy.open`` as
class ``batch`` — admission, the GPU guard and the shed gate apply — with at most
``concurrency`` lines in flight per batch. A shed line (``GPU_SATURATED``) waits out
``Retry-After`` and is tried again, never failed; a transient failure (other refusals,
unreachable or timed-out upstream, a status :func:`gpugate.retry.retryable` names) is tried
``attempts`` times, a full-jitter :class:`~gpugate.retry.Backoff` apart; anything else is the
line's answer. Each finished line is stored at once (:meth:`record_batch_item`), so a restart
resumes with the lines that have no item yet. Cancel stops the lines not yet started (those in
flight finish); the output then holds the finished ones.

A poison line or batch never retries forever (issue #14 defect 9). A finished line holding text
no store keeps the same way (a NUL or a lone surrogate, in its ``custom_id`` or in the answer)
is stored as a failed line, ``LINE_NOT_STORABLE`` naming where, on both backends. A run that
breaks otherwise is counted on the batch with its reason (:meth:`break_batch`) and the batch is
let go at once; once it broke ``max_breaks`` times it is not resumed again: it ends ``failed``
with that reason in ``errors`` and an output of the lines that finished. A run cut short by a
lost lease or a killed process is no break (nothing counts it): only a run that raised is.

Output (a file of purpose ``batch_output``): one line per input line *in input order*,
``{id, custom_id, response: {status_code, request_id, body}, error}``; ``error`` is
``{code, message}`` when the line failed (a non-2xx answer, or a gateway error such as
``UNKNOWN_MODEL``, whose OpenAI-shaped body is then the ``response``). The error file holds the
failed lines only (none: no error file).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable
from typing import Any, Protocol

from gpugate.clock import Clock, sleep_or_wake
from gpugate.config.untrusted import first_problem
from gpugate.core.classes import RequestClass
from gpugate.errors import ClientError, GpugateError, GpuSaturated, Refused, UpstreamError
from gpugate.retry import Backoff, retryable
from gpugate.services.batches import BatchLine, parse_lines
from gpugate.services.proxy import Outbound, Proxy, json_or_text, read_all
from gpugate.store.facade_base import BatchItem, BatchRecord, FacadeStore, FileRecord

log = logging.getLogger("gpugate.batches")

_JSON = [(b"content-type", b"application/json")]
ErrorBody = Callable[[GpugateError], tuple[int, bytes]]
#: A line's transient failure waits a full-jitter backoff of at most 2 s, doubling per failure
#: up to 30 s (the fixed waits it replaced were these ceilings).
LINE_BACKOFF_S = 2.0
LINE_MAX_BACKOFF_S = 30.0


class LineFiles(Protocol):
    """The files a runner reads a batch's lines from and writes its output to."""

    async def file_content(self, file_id: str) -> bytes: ...

    async def store_file(self, filename: str, purpose: str, data: bytes) -> FileRecord: ...


class BatchRunner:
    """Claims batches and runs them; see the module docstring."""

    def __init__(  # noqa: PLR0913 - collaborators, then keyword-only knobs
        self,
        store: FacadeStore,
        files: LineFiles,
        proxy: Proxy,
        clock: Clock,
        *,
        present: ErrorBody | None = None,
        concurrency: int = 16,
        lease_s: float = 60.0,
        sweep_s: float = 30.0,
        attempts: int = 3,
        backoff: Backoff | None = None,
        max_breaks: int = 3,
        takeover_at_start: bool = False,
    ) -> None:
        self._store = store
        self._files = files
        self._proxy = proxy
        self._clock = clock
        #: How a gateway error looks as an HTTP answer (status, body): given by the web layer,
        #: which owns the table of statuses (the composition root passes it); else a 502 with
        #: an OpenAI-shaped body.
        self._present: ErrorBody = present or _plain
        self._concurrency = concurrency
        self._lease_s = lease_s
        self._sweep_s = sweep_s
        self._attempts = attempts
        self._backoff = backoff or Backoff(LINE_BACKOFF_S, LINE_MAX_BACKOFF_S)
        self._max_breaks = max_breaks
        self._takeover = takeover_at_start
        self.owner = f"batches:{secrets.token_hex(6)}"
        self._wake = asyncio.Event()
        self._running: dict[str, asyncio.Event] = {}  # batch id -> its cancel signal
        self._tasks: set[asyncio.Task[None]] = set()
        self.lines_run = 0

    def wake(self) -> None:
        self._wake.set()

    def cancel(self, batch_id: str) -> None:
        """A batch of this process was cancelled: start no more of its lines."""
        if (signal := self._running.get(batch_id)) is not None:
            signal.set()

    async def tick(self) -> int:
        """Claim every batch that is free to run and start it; how many were started."""
        started = 0
        while batch := await self._store.claim_batch(
            self.owner, lease_s=self._lease_s, takeover=self._takeover
        ):
            self._running[batch.id] = asyncio.Event()
            task = asyncio.create_task(self._run(batch), name=f"gpugate.batch.{batch.id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            started += 1
        self._takeover = False
        return started

    async def run(self) -> None:
        try:
            while True:
                self._wake.clear()
                await self.tick()
                await sleep_or_wake(self._clock, self._wake, self._sweep_s)
        finally:
            await self.close()

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- one batch -----------------------------------------------------------------------

    async def _run(self, batch: BatchRecord) -> None:
        cancel = self._running[batch.id]
        if batch.breaks >= self._max_breaks:
            await self._give_up(batch)
            return
        heartbeat = asyncio.ensure_future(self._heartbeat(batch.id, cancel))
        try:
            data = await self._files.file_content(batch.input_file_id)
            lines = parse_lines(data, batch.endpoint, unsafe_text=True)
            done = {item.line for item in await self._store.batch_items(batch.id)}
            if batch.status == "cancelling":
                cancel.set()
            todo = [ln for ln in lines if ln.line not in done]
            await self._run_lines(todo, batch, cancel)
            if not heartbeat.done():
                await self._finish(batch, cancelled=cancel.is_set())
        except Exception as exc:  # noqa: BLE001 - any break is counted, with its reason
            heartbeat.cancel()
            await self._broke(batch, exc)
        finally:
            heartbeat.cancel()
            self._running.pop(batch.id, None)

    async def _broke(self, batch: BatchRecord, exc: Exception) -> None:
        """Count the break with its reason and let the batch go (resumed at once, or failed
        at its next claim once it broke ``max_breaks`` times)."""
        if isinstance(exc, GpugateError):  # what a client may read (a store error: no host)
            code, message = exc.code, exc.public_message
        else:  # an unexpected exception's text may name anything: the log has it
            code, message = "BATCH_BROKE", f"the batch runner broke on {type(exc).__name__}"
        error = {"code": code, "message": message[:500]}
        try:
            breaks = await self._store.break_batch(batch.id, self.owner, error=error)
        except Exception:  # the store is down: the lease runs out and a runner resumes it
            log.exception("batch %s broke and the break could not be counted", batch.id)
            return
        log.error(
            "batch %s broke (%d of %d): %s", batch.id, breaks or 0, self._max_breaks, exc,
            exc_info=exc,
        )  # fmt: skip
        self.wake()

    async def _give_up(self, batch: BatchRecord) -> None:
        """The batch broke ``max_breaks`` times: end it ``failed`` with the last reason and an
        output of the lines that finished."""
        last = (batch.error or {}).get("message", "no reason recorded")
        log.error("batch %s broke %d times; failing it: %s", batch.id, batch.breaks, last)
        await self._finish(batch, cancelled=False, failed=True)

    async def _run_lines(
        self, lines: list[BatchLine], batch: BatchRecord, cancel: asyncio.Event
    ) -> None:
        """Run ``lines``, ``concurrency`` at a time; none starts after a cancel or once the
        batch's completion window has closed (``expires_at``)."""
        pending = iter(lines)

        async def worker() -> None:
            for line in pending:
                if cancel.is_set() or self._expired(batch):
                    return
                item = _unstorable(line) if line.problem else _storable(await self._line(line))
                await self._store.record_batch_item(batch.id, item)
                self.lines_run += 1

        await asyncio.gather(*(worker() for _ in range(min(self._concurrency, len(lines)))))

    async def _heartbeat(self, batch_id: str, cancel: asyncio.Event) -> None:
        """Hold the lease; notice a cancel made by another replica; stop if the lease is lost."""
        while True:
            await self._clock.sleep(self._lease_s / 3)
            if not await self._store.extend_batch_lease(
                batch_id, self.owner, lease_s=self._lease_s
            ):
                cancel.set()
                log.warning("batch %s: lease lost; another runner has it now", batch_id)
                return
            latest = await self._store.get_batch(batch_id)
            if latest is not None and latest.status == "cancelling":
                cancel.set()

    def _expired(self, batch: BatchRecord) -> bool:
        return batch.expires_at is not None and self._clock.now() >= batch.expires_at

    async def _finish(self, batch: BatchRecord, *, cancelled: bool, failed: bool = False) -> None:
        """Write the output (and error) file and the final status: ``failed`` (it broke too
        often); ``cancelled``; ``expired`` when the completion window closed with lines not run
        (nothing else leaves any); else ``completed``."""
        items = await self._store.batch_items(batch.id)
        status = "completed"
        if failed:
            status = "failed"
        elif cancelled:
            status = "cancelled"
        elif len(items) < batch.total:
            status = "expired"
        output = _jsonl(item.output for item in items)
        bad = [item.output for item in items if not item.ok]
        out = await self._files.store_file(f"{batch.id}_output.jsonl", "batch_output", output)
        err = None
        if bad:
            err = await self._files.store_file(
                f"{batch.id}_error.jsonl", "batch_output", _jsonl(bad)
            )
        await self._store.finish_batch(
            batch.id,
            self.owner,
            status=status,
            output_file_id=out.id,
            error_file_id=None if err is None else err.id,
        )

    # -- one line ------------------------------------------------------------------------

    async def _line(self, line: BatchLine) -> BatchItem:
        body = json.dumps(line.body, separators=(",", ":")).encode()
        failures = 0
        while True:
            out = Outbound(
                "POST",
                line.url,
                _JSON,
                body,
                RequestClass.BATCH,
                self._clock.monotonic(),
                model=str(line.body["model"]),
            )
            try:
                status, request_id, answer = await self._send(out)
            except GpuSaturated as exc:
                await self._clock.sleep(exc.retry_after_s or 1.0)
                continue
            except (Refused, UpstreamError) as exc:
                failures += 1
                if failures < self._attempts:
                    await self._clock.sleep(self._backoff.delay(failures))
                    continue
                return self._refused(line, exc)
            except ClientError as exc:
                return self._refused(line, exc)
            if retryable(status) and failures + 1 < self._attempts:
                failures += 1
                await self._clock.sleep(self._backoff.delay(failures))
                continue
            return _item(line, status, request_id, answer)

    async def _send(self, out: Outbound) -> tuple[int, str, Any]:
        try:
            reply = await self._proxy.open(out)
        except GpugateError as exc:
            self._proxy.refused(out, exc)
            raise
        code: str | None = None
        try:
            try:
                body = await read_all(reply)
            except UpstreamError as exc:
                reply.broke()
                code = exc.code
                raise
            headers = dict(reply.headers)
            request_id = headers.get(b"x-request-id", b"").decode() or _request_id()
            return reply.status, request_id, json_or_text(body)
        finally:
            reply.close(code)

    def _refused(self, line: BatchLine, exc: GpugateError) -> BatchItem:
        status, body = self._present(exc)
        return _item(line, status, _request_id(), json.loads(body), error=exc)

    def __repr__(self) -> str:
        return f"<BatchRunner {self.owner} running={len(self._running)} lines_run={self.lines_run}>"


def _item(
    line: BatchLine, status: int, request_id: str, body: Any, *, error: GpugateError | None = None
) -> BatchItem:
    ok = error is None and 200 <= status < 300
    problem = None
    if error is not None:
        problem = {"code": error.code, "message": error.message}
    elif not ok:
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        problem = {"code": f"UPSTREAM_{status}", "message": str(message or body)[:500]}
    output = {
        "id": f"batch_req_{secrets.token_hex(12)}",
        "custom_id": line.custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": problem,
    }
    return BatchItem(line.line, line.custom_id, ok, output)


def _unstorable(line: BatchLine) -> BatchItem:
    """A line whose input holds text no store keeps alike: failed without being sent."""
    return _not_storable(line.line, line.custom_id, f"the input line's {line.problem}")


def _storable(item: BatchItem) -> BatchItem:
    """``item``, or when its output holds text a store does not keep the same (a NUL, a lone
    surrogate: PostgreSQL refuses it, SQLite would keep it) the line failed
    ``LINE_NOT_STORABLE`` saying where — the same on both backends, and never a broken batch."""
    found = first_problem(item.output)
    if found is None:
        return item
    path = ".".join(str(part) for part in found.path)
    return _not_storable(item.line, item.custom_id, f"the output's {path}: {found.message}")


def _not_storable(line: int, custom_id: str, where: str) -> BatchItem:
    escaped = json.dumps(custom_id)[1:-1]  # a NUL as the six characters \u0000
    output = {
        "id": f"batch_req_{secrets.token_hex(12)}",
        "custom_id": escaped,
        "response": None,
        "error": {"code": "LINE_NOT_STORABLE", "message": f"the line cannot be stored: {where}"},
    }
    return BatchItem(line, escaped, ok=False, output=output)


def _plain(exc: GpugateError) -> tuple[int, bytes]:
    error = {"message": exc.message, "type": "server_error", "code": exc.code}
    return 502, json.dumps({"error": error}).encode()


def _request_id() -> str:
    return f"req_{secrets.token_hex(12)}"


def _jsonl(docs: Any) -> bytes:
    return b"".join(
        json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() + b"\n" for doc in docs
    )
