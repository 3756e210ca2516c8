"""A poison batch never retries forever (issue 14 defect 9), on both store backends.

On main a batch line whose ``custom_id`` held ``\\u0000`` was accepted at upload, broke the runner
on PostgreSQL (which refuses NUL in text), was resumed after its lease by another replica, broke
again — 9 times in 13 minutes — and never ended. Now the edge refuses it at create, a poison
line that got in anyway fails alone (``LINE_NOT_STORABLE``), and a batch whose runs keep
breaking fails after ``max_breaks`` with the reason.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import openai
import pytest
from jobs_rig import Rig, rig

from gpugate.errors import StoreError
from gpugate.services.batch_runner import BatchRunner
from gpugate.services.batches import batch_view
from gpugate.store.facade_base import BatchItem, BatchRecord, NewBatch
from harness import make_config, model_servers, serving, upstream

NUL_ID = "line-\u0000-1"


def line(custom_id: str, n: int) -> dict[str, Any]:
    body = {"model": "qwen", "messages": [{"role": "user", "content": f"question {n}"}]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def jsonl(docs: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(doc).encode() + b"\n" for doc in docs)  # NUL escaped: \\u0000


async def test_a_batch_file_whose_custom_id_holds_a_nul_is_refused_400_at_create(dsn: str) -> None:
    async with (
        model_servers(("q0", ["qwen"])) as (q0,),
        serving(make_config(dsn, [upstream("q0", [q0.url], ["qwen"])])) as gw,
    ):
        api = openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
        data = jsonl([line("line-0", 0), line(NUL_ID, 1)])
        uploaded = await api.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        with pytest.raises(openai.BadRequestError) as refused:
            await api.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        listed = await gw.gateway.store.claim_batch("probe", lease_s=1)
        await api.close()
    assert 400 == refused.value.status_code
    assert "line 2: custom_id: text holds a NUL character (\\u0000)" in str(refused.value)
    assert listed is None  # no batch was made


async def stored_batch(r: Rig, docs: list[dict[str, Any]]) -> BatchRecord:
    """A batch stored without the edge's checks (as one uploaded before them was)."""
    data = jsonl(docs)
    file = await r.gateway.batches.store_file("in.jsonl", "batch", data)
    new = NewBatch(
        "batch_poison", "/v1/chat/completions", file.id, "24h", len(docs), None,
        r.clock.now() + timedelta(hours=24),
    )  # fmt: skip
    return await r.store.create_batch(new)


def runner_of(r: Rig, store: Any = None, **knobs: Any) -> BatchRunner:
    batches, proxy = r.gateway.batches, r.gateway.proxy
    return BatchRunner(store or r.store, batches, proxy, r.clock, **knobs)


async def until(check: Callable[[], Awaitable[bool]], *, what: str, within_s: float = 20) -> None:
    """Wait (bounded, in real time) until the async ``check`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not await check():
        assert loop.time() < deadline, f"{what}: not within {within_s} s"
        await asyncio.sleep(0.02)


async def ended(r: Rig, batch_id: str) -> BatchRecord:
    """The batch once it reached a final status."""
    latest: list[BatchRecord] = []

    async def terminal() -> bool:
        batch = await r.store.get_batch(batch_id)
        assert batch is not None
        latest[:] = [batch]
        return batch.terminal

    await until(terminal, what=f"batch {batch_id} ended")
    return latest[0]


async def test_a_poison_line_that_got_in_fails_alone_with_the_reason_and_the_batch_completes(
    dsn: str,
) -> None:
    async with rig(dsn) as r:
        batch = await stored_batch(r, [line("line-0", 0), line(NUL_ID, 1), line("line-2", 2)])
        runner = runner_of(r)
        await runner.tick()
        done = await ended(r, batch.id)
        items = {item.line: item for item in await r.store.batch_items(batch.id)}
    assert ("completed", 2, 1, 0) == (done.status, done.completed, done.failed, done.breaks)
    poison = items[1]
    assert (False, "line-\\u0000-1") == (poison.ok, poison.custom_id)
    assert {
        "code": "LINE_NOT_STORABLE",
        "message": "the line cannot be stored: the input line's custom_id: text holds a NUL "
        "character (\\u0000)",
    } == poison.output["error"]
    assert (True, True) == (items[0].ok, items[2].ok)


class BreakingStore:
    """The real store, except that storing line 0 of any batch always fails."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def record_batch_item(self, batch_id: str, item: BatchItem) -> bool:
        if item.line == 0:
            self.refused += 1
            raise StoreError("the store refused the line (host db.internal:5432)")
        return bool(await self._store.record_batch_item(batch_id, item))


async def test_a_batch_that_keeps_breaking_fails_after_max_breaks_with_the_reason(
    dsn: str,
) -> None:
    async with rig(dsn) as r:
        batch = await stored_batch(r, [line("line-0", 0), line("line-1", 1)])
        breaking = BreakingStore(r.store)
        runner = runner_of(r, breaking, max_breaks=3)
        seen: list[int] = []
        for n in range(1, 4):
            await runner.tick()

            async def counted(n: int = n) -> bool:
                latest = await r.store.get_batch(batch.id)
                return latest is not None and latest.breaks == n and latest.owner is None

            await until(counted, what=f"break {n} counted")
            seen.append(breaking.refused)
        await runner.tick()  # the fourth claim: broke 3 times, so it fails
        done = await ended(r, batch.id)
        items = await r.store.batch_items(batch.id)
        content = await r.gateway.batches.file_content(done.output_file_id or "")
    view = batch_view(done)
    assert [1, 2, 3] == seen  # each run tried line 0 once and broke on it
    assert ("failed", 3) == (done.status, done.breaks)
    assert done.failed_at is not None
    assert [1] == [item.line for item in items]  # line 1 finished and is in the output
    assert 1 == len(content.splitlines())
    assert {
        "object": "list",
        "data": [
            {"code": "STORE_ERROR", "message": "The store failed.", "param": None, "line": None}
        ],
    } == view["errors"]
    assert "db.internal" not in json.dumps(view)  # the store's text stays in the log
