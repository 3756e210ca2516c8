"""The OpenAI Batch API façade through the real ``openai`` client, against fake model servers."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from gpugate.clock import ManualClock, SystemClock
from gpugate.store.facade_base import BatchItem
from gpugate.store.factory import open_store
from harness import RunningGateway, make_config, model_servers, serving, upstream

FAILING = "line-bad"
CONCURRENCY = 16  # the runner's default lines in flight per batch


def batch_file(lines: int, *, failing_at: int | None = None) -> bytes:
    """``lines`` chat requests for ``m1``; the one at ``failing_at`` asks for a model nobody
    serves."""
    out = []
    for n in range(lines):
        bad = n == failing_at
        body = {
            "model": "no-such-model" if bad else "m1",
            "messages": [{"role": "user", "content": f"question {n}"}],
        }
        custom_id = FAILING if bad else f"line-{n}"
        line = {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": body,
        }
        out.append(json.dumps(line))
    return ("\n".join(out) + "\n").encode()


def client(gw: RunningGateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)


async def submit(api: openai.AsyncOpenAI, data: bytes) -> str:
    uploaded = await api.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = await api.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id


async def finished(api: openai.AsyncOpenAI, batch_id: str, *, within_s: float = 60.0) -> Any:
    """The batch once it has ended (polled through the client, bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        batch = await api.batches.retrieve(batch_id)
        if batch.status in ("completed", "cancelled", "failed", "expired"):
            return batch
        assert loop.time() < deadline, f"batch still {batch.status}"
        await asyncio.sleep(0.05)


async def stored_items(dsn: str, batch_id: str) -> list[BatchItem]:
    store = open_store(dsn, clock=SystemClock())
    await store.open()
    try:
        return await store.batch_items(batch_id)
    finally:
        await store.close()


def sqlite_rows(dsn: str, table: str) -> int:
    """How many rows an SQLite store's ``table`` holds."""
    with contextlib.closing(sqlite3.connect(dsn.removeprefix("sqlite:///"))) as db:
        (count,) = db.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(count)


async def completed_lines(gw: RunningGateway, batch_id: str, at_least: int) -> None:
    """Wait (bounded) until the store holds ``at_least`` finished lines of the batch."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while True:
        batch = await gw.gateway.store.get_batch(batch_id)
        if batch is not None and batch.completed >= at_least:
            return
        assert loop.time() < deadline, "the batch made no progress"
        await asyncio.sleep(0.02)


async def test_a_1000_line_batch_runs_through_the_openai_client_with_the_failing_line_reported(
    sqlite_dsn: str,
) -> None:
    """Done-when 2 of issue 9."""
    async with (
        model_servers(("s1", ["m1"]), ("s2", ["m1"])) as servers,
        serving(make_config(sqlite_dsn, [upstream("u1", [s.url for s in servers], ["m1"])])) as gw,
    ):
        api = client(gw)
        batch_id = await submit(api, batch_file(1000, failing_at=500))
        batch = await finished(api, batch_id)
        output = (await api.files.content(batch.output_file_id)).content
        errors = (await api.files.content(batch.error_file_id)).content
        await api.close()
        calls = sum(s.stats.requests["/v1/chat/completions"] for s in servers)

    lines = [json.loads(line) for line in output.splitlines()]
    assert batch.status == "completed"
    assert (batch.request_counts.total, batch.request_counts.completed) == (1000, 999)
    assert batch.request_counts.failed == 1
    assert [line["custom_id"] for line in lines][:3] == ["line-0", "line-1", "line-2"]
    assert len(lines) == 1000
    assert lines[500]["custom_id"] == FAILING
    assert lines[500]["error"]["code"] == "UNKNOWN_MODEL"
    assert lines[500]["response"]["status_code"] == 404
    assert lines[0]["error"] is None
    assert lines[0]["response"]["status_code"] == 200
    assert lines[0]["response"]["body"]["object"] == "chat.completion"
    assert [json.loads(line)["custom_id"] for line in errors.splitlines()] == [FAILING]
    assert calls == 999


async def test_a_bad_input_line_is_refused_400_naming_it_and_no_batch_is_made(
    sqlite_dsn: str,
) -> None:
    async with (
        model_servers(("s1", ["m1"])) as (s1,),
        serving(make_config(sqlite_dsn, [upstream("u1", [s1.url], ["m1"])])) as gw,
    ):
        api = client(gw)
        data = batch_file(2) + b'{"custom_id": "x", "method": "GET", "url": "/v1/models"}\n'
        uploaded = await api.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        with pytest.raises(openai.BadRequestError, match="line 3"):
            await api.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        await api.close()
    assert 0 == sqlite_rows(sqlite_dsn, "batches")


async def test_a_batch_resumes_after_a_restart_without_rerunning_finished_lines(
    tmp_path: Path,
) -> None:
    dsn = f"sqlite:///{tmp_path / 'gpugate.db'}"
    blobs = {"kind": "local", "dir": str(tmp_path / "blobs")}
    async with model_servers(("s1", ["m1"])) as (s1,):
        config = make_config(dsn, [upstream("u1", [s1.url], ["m1"])], blobs=blobs)
        async with serving(config) as gw:
            api = client(gw)
            s1.update(delay_s=0.05)
            batch_id = await submit(api, batch_file(200))
            await completed_lines(gw, batch_id, 20)
            await api.close()
        stored = len(await stored_items(dsn, batch_id))  # as the first process left them
        before_restart = s1.stats.requests["/v1/chat/completions"]
        s1.update(delay_s=0.0)
        async with serving(config) as gw:
            api = client(gw)
            batch = await finished(api, batch_id)
            output = (await api.files.content(batch.output_file_id)).content
            await api.close()
        after = s1.stats.requests["/v1/chat/completions"] - before_restart

    lines = [json.loads(line) for line in output.splitlines()]
    assert batch.status == "completed"
    assert batch.request_counts.completed == 200
    assert [line["custom_id"] for line in lines] == [f"line-{n}" for n in range(200)]
    assert stored >= 20
    assert after == 200 - stored  # only the lines without a stored item ran again
    assert before_restart - stored <= CONCURRENCY  # at most the lines in flight at the stop


async def test_cancel_stops_the_remaining_lines_and_keeps_the_finished_ones(
    sqlite_dsn: str,
) -> None:
    async with (
        model_servers(("s1", ["m1"])) as (s1,),
        serving(make_config(sqlite_dsn, [upstream("u1", [s1.url], ["m1"])])) as gw,
    ):
        api = client(gw)
        s1.update(delay_s=0.05)
        batch_id = await submit(api, batch_file(500))
        await completed_lines(gw, batch_id, 10)
        cancelling = await api.batches.cancel(batch_id)
        batch = await finished(api, batch_id)
        output = (await api.files.content(batch.output_file_id)).content
        await api.close()
        calls = s1.stats.requests["/v1/chat/completions"]

    done = batch.request_counts.completed
    assert cancelling.status == "cancelling"
    assert batch.status == "cancelled"
    assert 10 <= done < 500
    assert len(output.splitlines()) == done
    assert calls == done  # the lines in flight at the cancel finished; no others started


async def test_lines_given_inline_make_a_batch_as_an_uploaded_file_does(
    sqlite_dsn: str,
) -> None:
    lines = [json.loads(line) for line in batch_file(20, failing_at=3).splitlines()]
    async with (
        model_servers(("s1", ["m1"])) as (s1,),
        serving(make_config(sqlite_dsn, [upstream("u1", [s1.url], ["m1"])])) as gw,
    ):
        api = client(gw)
        created = await api.batches.create(
            input_file_id="",  # the client requires it; `input` is gpugate's extension
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_body={"input_file_id": None, "input": lines},
        )
        batch = await finished(api, created.id)
        inline_input = (await api.files.content(batch.input_file_id)).content
        output = (await api.files.content(batch.output_file_id)).content
        with pytest.raises(openai.BadRequestError, match="not both"):
            await api.batches.create(
                input_file_id=batch.input_file_id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                extra_body={"input": lines},
            )
        await api.close()

    assert (19, 1) == (batch.request_counts.completed, batch.request_counts.failed)
    assert lines == [json.loads(line) for line in inline_input.splitlines()]
    errors = {
        json.loads(line)["custom_id"]: json.loads(line)["error"] for line in output.splitlines()
    }
    assert "UNKNOWN_MODEL" == errors[FAILING]["code"]


async def test_a_batch_whose_completion_window_closes_expires_with_the_lines_it_finished(
    sqlite_dsn: str,
) -> None:
    clock = ManualClock(datetime.now(UTC))
    async with (
        model_servers(("s1", ["m1"])) as (s1,),
        serving(make_config(sqlite_dsn, [upstream("u1", [s1.url], ["m1"])]), clock=clock) as gw,
    ):
        api = client(gw)
        s1.update(delay_s=0.05)
        batch_id = await submit(api, batch_file(300))
        await completed_lines(gw, batch_id, 10)
        clock.advance(24 * 3600)  # the 24 h window closes
        batch = await finished(api, batch_id)
        output = (await api.files.content(batch.output_file_id)).content
        await api.close()
        calls = s1.stats.requests["/v1/chat/completions"]

    done = batch.request_counts.completed
    assert "expired" == batch.status
    assert batch.expired_at is not None
    assert 10 <= done < 300
    assert done == len(output.splitlines())
    assert calls == done  # no line started after the window closed


async def test_a_chunked_upload_over_max_body_bytes_is_refused_413_and_no_file_is_stored(
    tmp_path: Path, sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    limit = 1000
    boundary = "gpugate-test-boundary"
    head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()

    async def chunked() -> AsyncIterator[bytes]:  # no length known up front: sent chunked
        yield head
        for _ in range(10):
            yield b"x" * limit
        yield tail

    blobs = tmp_path / "blobs"
    config = make_config(
        sqlite_dsn,
        [upstream("u1", ["http://127.0.0.1:9"], ["m1"])],
        server={"max_body_bytes": limit},
        blobs={"kind": "local", "dir": str(blobs)},
    )
    async with serving(config) as gw:
        async with http.post(
            gw.v1 + "/files",
            data=chunked(),
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        ) as resp:
            body = await resp.json()
            sent = resp.request_info.headers
    assert "Content-Length" not in sent
    assert (413, "PAYLOAD_TOO_LARGE") == (resp.status, body["error"]["code"])
    assert 0 == sqlite_rows(sqlite_dsn, "batch_files")
    assert not [path for path in blobs.rglob("*") if path.is_file()]
