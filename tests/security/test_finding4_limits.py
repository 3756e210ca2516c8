"""Finding 4 (issue #15), the limits on what a client can make the gateway store: a multipart
upload is refused at ``max_body_bytes`` while it streams (it was spooled whole: 30 MiB to a
temporary file with a 1 MiB limit), a stored idempotent response has a size cap, and a job's
``Idempotency-Key`` is 1 to 255 characters (a 6,000-character key hit PostgreSQL's index limit
as a 503). Both store backends."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from raw_rig import Answer, parse_answer

from gpugate.fleet import ServerBehaviour
from harness import RunningGateway, make_config, model_servers, serving, upstream

LIMIT = 1024 * 1024


@pytest.fixture
async def gw(dsn: str) -> AsyncIterator[RunningGateway]:
    behaviour = ServerBehaviour(chunks=64)
    async with model_servers(("s1", ["m1"]), behaviour=behaviour) as servers:
        config = make_config(
            dsn,
            [upstream("u1", [servers[0].url], ["m1"])],
            server={"max_body_bytes": LIMIT, "max_idempotent_response_bytes": 200},
        )
        async with serving(config) as running:
            yield running


async def stream_upload(gw: RunningGateway, total: int) -> tuple[Answer, int]:
    """A chunked multipart ``POST /v1/files`` of ``total`` file bytes; the answer, and how many
    bytes had been sent when it came."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode()
    sent = 0

    async def upload() -> None:
        nonlocal sent
        writer.write(
            b"POST /v1/files HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            + f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n".encode()
        )
        piece = b"x" * 65536
        with contextlib.suppress(OSError):
            writer.write(b"%x\r\n%s\r\n" % (len(head), head))
            while sent < total:
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                sent += len(piece)
            tail = f"\r\n--{boundary}--\r\n".encode()
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
            await writer.drain()

    sender = asyncio.create_task(upload())
    try:
        async with asyncio.timeout(30):
            answer = parse_answer(await reader.readuntil(b"\r\n\r\n"))
            body = await reader.readexactly(int(answer.headers["content-length"]))
        at = sent
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return Answer(answer.status, answer.headers, body), at


async def test_finding4_a_multipart_upload_over_the_limit_is_refused_while_it_streams(
    gw: RunningGateway,
) -> None:
    answer, sent_when_answered = await stream_upload(gw, 30 * LIMIT)
    assert (413, "PAYLOAD_TOO_LARGE") == (answer.status, answer.error_code())
    assert sent_when_answered < 30 * LIMIT  # answered mid-upload, not after spooling 30 MiB
    small, _ = await stream_upload(gw, LIMIT // 2)
    assert 200 == small.status


async def test_finding4_a_response_over_the_stored_size_cap_is_not_kept_for_replay(
    gw: RunningGateway,
) -> None:
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as http:
        replays = []
        for _ in range(2):
            async with http.post(
                gw.v1 + "/chat/completions", json=body, headers={"Idempotency-Key": "big-one"}
            ) as resp:
                await resp.read()
                replays.append((resp.status, resp.headers.get("Idempotent-Replayed")))
    assert [(200, None), (200, None)] == replays  # sent twice: the big answer was not stored
    assert 0 == await stored_idempotency_rows(gw)


async def stored_idempotency_rows(gw: RunningGateway) -> int:
    return (await gw.gateway.store.table_counts())["idempotency"]


@pytest.mark.parametrize(("key", "status"), [("k" * 255, 202), ("k" * 256, 400), ("", 400)])
async def test_finding4_a_job_idempotency_key_is_1_to_255_characters(
    gw: RunningGateway, key: str, status: int
) -> None:
    job = {"model": "m1", "input": {"messages": [{"role": "user", "content": "x"}]}}
    async with (
        aiohttp.ClientSession() as http,
        http.post(gw.v1 + "/jobs", json=job, headers={"Idempotency-Key": key}) as resp,
    ):
        answer = json.loads(await resp.read())
    assert status == resp.status
    if status == 400:
        assert "BAD_REQUEST" == answer["error"]["code"]
