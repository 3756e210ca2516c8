"""Finding 3 (issue #15): connection-level denial of service.

Before: no header read timeout (20 half-sent-header connections still open after 40 s), no
header size cap (a 40 MiB header got 200 and +36 MiB RSS), no connection cap, ``/u/``
trickling uploads held admission slots (4 of them made a normal request fail ``QUEUE_FULL``),
and ``?wait=`` waiters were unbounded. Each limit answers the one JSON error shape and closes
the connection (``web/connections.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from raw_rig import Answer, parse_answer, recording_upstream, send_raw

from gpugate.fleet import ServerBehaviour
from harness import (
    RunningGateway,
    connection,
    eventually,
    make_config,
    model_servers,
    serving,
    upstream,
)

QUICK = {"header_timeout_s": 0.5, "body_timeout_s": 0.5}


@contextlib.asynccontextmanager
async def gateway(sqlite_dsn: str, **server: object) -> AsyncIterator[RunningGateway]:
    async with recording_upstream() as up:
        config = make_config(
            sqlite_dsn,
            [upstream("int", [up.url], ["m1"], max_inflight=1, max_queue=0)],
            server=server,
        )
        async with serving(config) as gw:
            yield gw


async def answer_of(reader: asyncio.StreamReader, *, within_s: float = 10.0) -> Answer:
    """The gateway's answer read to the end of the connection (it closes after a refusal)."""
    async with asyncio.timeout(within_s):
        return parse_answer(await reader.read())


async def head_and_body(reader: asyncio.StreamReader, *, within_s: float = 10.0) -> Answer:
    """The gateway's answer, read by its ``Content-Length`` (not to the end of the connection)."""
    async with asyncio.timeout(within_s):
        answer = parse_answer(await reader.readuntil(b"\r\n\r\n"))
        body = await reader.readexactly(int(answer.headers["content-length"]))
    return Answer(answer.status, answer.headers, body)


async def send_quietly(writer: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(OSError):
        writer.write(data)
        await writer.drain()


async def test_finding3_half_sent_headers_get_408_and_the_connection_closed(
    sqlite_dsn: str,
) -> None:
    async with gateway(sqlite_dsn, **QUICK) as gw, contextlib.AsyncExitStack() as stack:
        conns = [await stack.enter_async_context(connection(gw)) for _ in range(20)]
        for _, writer in conns:
            await send_quietly(writer, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        answers = [await answer_of(reader) for reader, _ in conns]
        silent_reader, _ = await stack.enter_async_context(connection(gw))  # sends nothing
        silent = await answer_of(silent_reader)
    assert [(408, "REQUEST_TIMEOUT")] * 21 == [
        (a.status, a.error_code()) for a in [*answers, silent]
    ]


async def test_finding3_an_idle_keep_alive_connection_is_not_answered_408(sqlite_dsn: str) -> None:
    """The header timeout is for a head under way; between requests, keep-alive rules."""
    async with gateway(sqlite_dsn, **QUICK) as gw, connection(gw) as (reader, writer):
        await send_quietly(writer, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await head_and_body(reader)
        idle = asyncio.create_task(reader.read(1))
        done, _ = await asyncio.wait({idle}, timeout=4 * QUICK["header_timeout_s"])
        idle.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await idle
        await send_quietly(writer, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        second = await head_and_body(reader)
    assert (200, set(), 200) == (first.status, done, second.status)


async def test_finding3_a_huge_header_gets_431_without_being_buffered_whole(
    sqlite_dsn: str,
) -> None:
    async with gateway(sqlite_dsn) as gw, connection(gw) as (reader, writer):
        await send_quietly(writer, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        answered = asyncio.create_task(head_and_body(reader))
        sent = 0
        while sent < 40 * 1024 * 1024 and not answered.done():  # until the gateway answers
            await send_quietly(writer, b"a" * 65536)
            sent += 65536
            await asyncio.sleep(0)
        answer = await answered
    assert (431, "HEADERS_TOO_LARGE") == (answer.status, answer.error_code())
    assert sent < 16 * 1024 * 1024  # answered long before 40 MiB (64 KiB + socket buffers)


async def test_finding3_an_oversized_header_sent_at_once_gets_431(sqlite_dsn: str) -> None:
    async with gateway(sqlite_dsn) as gw:
        answer = await send_raw(gw.url, "GET", "/healthz", headers={"X-Long": "a" * 70000})
    assert (431, "HEADERS_TOO_LARGE") == (answer.status, answer.error_code())


async def test_finding3_too_many_headers_get_431(sqlite_dsn: str) -> None:
    headers = {f"X-H{n}": "v" for n in range(101)}
    async with gateway(sqlite_dsn) as gw:
        answer = await send_raw(gw.url, "GET", "/healthz", headers=headers)
        within = await send_raw(gw.url, "GET", "/healthz", headers=dict(list(headers.items())[:90]))
    assert (431, "HEADERS_TOO_LARGE") == (answer.status, answer.error_code())
    assert 200 == within.status


async def test_finding3_connections_beyond_the_cap_get_503_with_retry_after(
    sqlite_dsn: str,
) -> None:
    held = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"  # keep-alive: the connection stays open
    async with gateway(sqlite_dsn, max_connections=5) as gw, contextlib.AsyncExitStack() as stack:
        for _ in range(5):
            reader, writer = await stack.enter_async_context(connection(gw))
            await send_quietly(writer, held)
            async with asyncio.timeout(10):
                assert b"200" in await reader.readuntil(b"\r\n")
        answer = await send_raw(gw.url, "GET", "/healthz")
    assert (503, "TOO_MANY_CONNECTIONS") == (answer.status, answer.error_code())
    assert "1" == answer.headers["retry-after"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/u/int/v1/files", "/v1/jobs"])
async def test_finding3_a_body_that_stops_arriving_gets_408(sqlite_dsn: str, path: str) -> None:
    async with gateway(sqlite_dsn, **QUICK) as gw, connection(gw) as (reader, writer):
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        await send_quietly(writer, head.encode() + b"Content-Length: 100\r\n\r\n" + b'{"model":')
        answer = await answer_of(reader)
    assert (408, "REQUEST_TIMEOUT") == (answer.status, answer.error_code())


async def test_finding3_trickling_u_uploads_hold_no_admission_slot(sqlite_dsn: str) -> None:
    """max_inflight 1, max_queue 0: before, one trickler took the slot and the rest QUEUE_FULL."""
    async with gateway(sqlite_dsn, body_timeout_s=30) as gw, contextlib.AsyncExitStack() as stack:
        for _ in range(4):
            _, writer = await stack.enter_async_context(connection(gw))
            head = b"POST /u/int/v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
            await send_quietly(writer, head + b"x" * 10)
        normal = [
            await send_raw(gw.url, "POST", "/u/int/v1/files", body=b"whole") for _ in range(3)
        ]
        pool = gw.gateway.registry.upstream("int").pool
        assert 0 == pool.inflight
    assert [200, 200, 200] == [a.status for a in normal]


async def test_finding3_waiters_beyond_the_cap_get_their_job_at_once(sqlite_dsn: str) -> None:
    body = {"model": "m1", "input": {"messages": [{"role": "user", "content": "x"}]}}
    async with (
        model_servers(("s1", ["m1"]), behaviour=ServerBehaviour(hang=True)) as servers,
        serving(
            make_config(
                sqlite_dsn, [upstream("u1", [servers[0].url], ["m1"])], server={"max_waiters": 2}
            )
        ) as gw,
        aiohttp.ClientSession() as http,
    ):
        waiter = gw.gateway.sync_front._waiter  # the count is what is pinned

        async def submit() -> tuple[int, dict[str, object]]:
            async with http.post(gw.v1 + "/jobs?wait=60", json=body) as resp:
                return resp.status, json.loads(await resp.read())

        waiting = [asyncio.create_task(submit()) for _ in range(2)]
        await eventually(lambda: waiter.waiting == 2, within_s=10, what="two waiters")
        async with asyncio.timeout(10):
            status, job = await submit()
        still = (waiter.waiting, [t.done() for t in waiting])
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
    assert (202, True) == (status, bool(job["slug"]))
    assert (2, [False, False]) == still
    assert 1 == waiter.turned_away
