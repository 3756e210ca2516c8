"""The data plane's client's clocks: connect, first byte (a slow head), the idle silence between
two pieces of a body once a stream has begun, and the whole request's total."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator

import pytest
from raw_upstream import Peer, upstream

from gpugate.adapters.http1 import HeadDeadlines, HeadTimedOut, Response
from gpugate.adapters.upstream_client import Timeouts, UpstreamClient
from gpugate.errors import UpstreamTimeout
from harness import eventually


async def _head_then(peer: Peer, pieces: int, pause_s: float) -> None:
    await peer.request()
    await peer.answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(pieces):
        await peer.answer(b"6\r\ndata:\n\r\n")
        await asyncio.sleep(pause_s)
    await peer.wait_closed_by_client()


async def test_a_head_slower_than_first_byte_s_times_out_and_closes_the_connection(
    client: UpstreamClient,
) -> None:
    async def slow_head(peer: Peer, _: int) -> None:
        await peer.request()
        await peer.answer(b"HTTP/1.1 200 OK\r\n")  # a first line, then nothing
        await peer.wait_closed_by_client()

    async with upstream(slow_head) as up:
        started = time.monotonic()
        with pytest.raises(UpstreamTimeout, match="u sent no response within") as caught:
            await client.send("GET", up.url + "/", [], None, Timeouts(1, 0.3, 5), label="u")
        elapsed = time.monotonic() - started
        await eventually(lambda: up.peers[0].closed_by_client, what="connection closed")
    assert not caught.value.connect_failed
    assert 0.28 <= elapsed < 1.0


@contextlib.contextmanager
def full_backlog() -> Iterator[int]:
    """A loopback port whose accept queue is full: a further connect hangs in SYN_SENT."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.settimeout(0.0)  # non-blocking: the handshake is the kernel's
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        server.close()


async def test_a_connect_slower_than_connect_s_is_a_connect_failure(client: UpstreamClient) -> None:
    with full_backlog() as port:
        await asyncio.sleep(0.05)  # the fillers' handshakes settle into the queue
        started = time.monotonic()
        with pytest.raises(UpstreamTimeout, match="connect to u timed out") as caught:
            await client.send(
                "GET", f"http://127.0.0.1:{port}/", [], None, Timeouts(0.3, 2, 5), label="u"
            )
        elapsed = time.monotonic() - started
    assert caught.value.connect_failed
    assert 0.28 <= elapsed < 1.5


async def test_a_stream_silent_longer_than_its_idle_timeout_fails_the_next_read(
    client: UpstreamClient,
) -> None:
    async with upstream(lambda peer, _: _head_then(peer, 1, 0)) as up:
        response = await client.send("GET", up.url + "/", [], None, Timeouts(1, 1, 30))
        response.set_idle_timeout(0.3)
        assert b"data:\n" == await response.read_chunk()
        started = time.monotonic()
        with pytest.raises(UpstreamTimeout, match="stopped sending"):
            await response.read_chunk()
        elapsed = time.monotonic() - started
        await eventually(lambda: up.peers[0].closed_by_client, what="connection closed")
    assert 0.2 <= elapsed < 1.0


async def test_a_stream_that_keeps_talking_outlives_its_idle_timeout(
    client: UpstreamClient,
) -> None:
    async with upstream(lambda peer, _: _head_then(peer, 8, 0.1)) as up:
        response = await client.send("GET", up.url + "/", [], None, Timeouts(1, 1, 30))
        response.set_idle_timeout(0.3)
        got = b""
        while len(got) < 8 * 6:
            got += await response.read_chunk()
        response.release()
    assert b"data:\n" * 8 == got


async def test_a_reader_behind_is_not_an_idle_upstream(client: UpstreamClient) -> None:
    """Time the body sits unread in our buffer is not the upstream's silence."""
    async with upstream(lambda peer, _: _head_then(peer, 2, 0)) as up:
        response = await client.send("GET", up.url + "/", [], None, Timeouts(1, 1, 30))
        response.set_idle_timeout(0.2)
        await asyncio.sleep(0.5)  # both pieces arrived long ago
        assert b"data:\n" * 2 == await response.read_chunk()
        response.release()


async def test_the_total_timeout_bounds_the_body_too(client: UpstreamClient) -> None:
    async with upstream(lambda peer, _: _head_then(peer, 100, 0.05)) as up:
        started = time.monotonic()
        response = await client.send("GET", up.url + "/", [], None, Timeouts(1, 1, 0.5))
        with pytest.raises(UpstreamTimeout):
            await response.read()
        elapsed = time.monotonic() - started
        response.release()
    assert 0.45 <= elapsed < 1.5  # uvloop timers have a millisecond grain


async def test_each_response_fails_at_its_own_first_byte_deadline_under_one_timer() -> None:
    loop = asyncio.get_running_loop()
    deadlines = HeadDeadlines(loop)
    late, early, answered = Response(), Response(), Response()
    started = loop.time()

    async def wait(response: Response, after_s: float) -> str:
        try:
            await response.wait_head(started + after_s, deadlines)
        except HeadTimedOut:
            return f"timed out after {round(loop.time() - started, 1)} s"
        return "head"

    waits = [
        asyncio.create_task(wait(r, s)) for r, s in ((late, 0.4), (early, 0.2), (answered, 0.3))
    ]
    await asyncio.sleep(0)
    answered.got_head(200, [])
    async with asyncio.timeout(5):
        outcomes = await asyncio.gather(*waits)
    assert ["timed out after 0.4 s", "timed out after 0.2 s", "head"] == outcomes
    assert "<HeadDeadlines waiting=0 due=inf>" == repr(deadlines)
