"""The connections the data plane's client keeps: reuse, the stale keep-alive retried once, the
server's ``Connection: close``, idle expiry and the idle cap, the limit on connections in use,
backpressure from a slow reader, and what releasing, cancelling and closing do to a connection."""

from __future__ import annotations

import asyncio

import pytest
from raw_upstream import TIMEOUTS, Peer, Request, keep_alive, ok, upstream

from gpugate.adapters import http1
from gpugate.adapters.upstream_client import Timeouts, UpstreamClient
from gpugate.errors import UpstreamError, UpstreamTimeout, UpstreamUnreachable
from harness import eventually


async def _get(client: UpstreamClient, url: str) -> bytes:
    response = await client.send("POST", url, [], b"{}", TIMEOUTS)
    try:
        return await response.read()
    finally:
        response.release()


async def test_a_pooled_connection_the_server_closed_is_retried_once_on_a_fresh_one(
    client: UpstreamClient,
) -> None:
    """The server answers once per connection, then drops the next request unanswered (the
    race of a keep-alive closed while idle): the client sends it again on a new connection."""
    seen: list[Request] = []

    async def once_per_connection(peer: Peer, _: int) -> None:
        request = await peer.request()
        assert request is not None
        seen.append(request)
        await peer.answer(ok(b"answered"))
        if await peer.request() is not None:  # arrived: dropped with no byte of answer
            peer.writer.close()

    async with upstream(once_per_connection) as up:
        first = await _get(client, up.url + "/a")
        second = await _get(client, up.url + "/a")
    assert [b"answered", b"answered"] == [first, second]
    assert 2 == len(up.peers)
    assert 2 == len(seen)  # the dropped request was answered once, on the second connection


async def test_a_pooled_connection_reset_after_the_request_arrived_is_the_upstreams_failure(
    client: UpstreamClient,
) -> None:
    """A reset is not the idle close's FIN: the upstream had the request and broke; the caller's
    retry policy decides, the request is not sent again behind its back."""
    requests: list[Request] = []

    async def reset_the_second(peer: Peer, _: int) -> None:
        while (request := await peer.request()) is not None:
            requests.append(request)
            if len(requests) == 2:
                peer.reset()
                return
            await peer.answer(ok())

    async with upstream(reset_the_second) as up:
        assert b"hello" == await _get(client, up.url + "/")
        with pytest.raises(UpstreamUnreachable, match="failed before responding"):
            await client.send("POST", up.url + "/", [], b"{}", TIMEOUTS)
    assert 2 == len(requests)
    assert 1 == len(up.peers)


async def test_a_fresh_connection_closed_before_answering_is_the_upstreams_failure(
    client: UpstreamClient,
) -> None:
    requests: list[Request] = []

    async def drop(peer: Peer, _: int) -> None:
        request = await peer.request()
        assert request is not None
        requests.append(request)
        peer.writer.close()

    async with upstream(drop) as up:
        with pytest.raises(UpstreamUnreachable, match="failed before responding") as caught:
            await client.send("POST", up.url + "/", [], b"{}", TIMEOUTS, label="u")
    assert 1 == len(requests)  # not sent twice
    assert not caught.value.connect_failed


async def test_a_pooled_connection_that_broke_after_some_answer_is_not_retried(
    client: UpstreamClient,
) -> None:
    async def half_answer_the_second(peer: Peer, _: int) -> None:
        await peer.request()
        await peer.answer(ok(b"first"))
        await peer.request()
        await peer.answer(b"HTTP/1.1 200 OK\r\nContent-Len")
        peer.writer.close()

    async with upstream(half_answer_the_second) as up:
        assert b"first" == await _get(client, up.url + "/")
        with pytest.raises(UpstreamUnreachable, match="failed before responding"):
            await client.send("POST", up.url + "/", [], b"{}", TIMEOUTS)
    assert 1 == len(up.peers)


async def test_connection_close_from_the_server_is_honoured(client: UpstreamClient) -> None:
    async with upstream(keep_alive(ok(b"bye", b"Connection: close"))) as up:
        for _ in range(2):
            assert b"bye" == await _get(client, up.url + "/")
        await eventually(lambda: all(p.closed_by_client or p.writer.is_closing() for p in up.peers))
    assert 2 == len(up.peers)


async def test_an_idle_connection_is_closed_after_keepalive_s() -> None:
    client = UpstreamClient(keepalive_s=0.2)
    await client.start()
    try:

        async def answer_then_watch(peer: Peer, _: int) -> None:
            await peer.request()
            await peer.answer(ok())
            await peer.wait_closed_by_client()

        async with upstream(answer_then_watch) as up:
            await _get(client, up.url + "/")
            await eventually(lambda: up.peers[0].closed_by_client, within_s=2.0, what="expired")
            assert b"hello" == await _get(client, up.url + "/")  # a new connection
            assert 2 == len(up.peers)
    finally:
        await client.close()


async def test_idle_connections_beyond_max_idle_are_closed() -> None:
    client = UpstreamClient(max_idle=1)
    await client.start()
    gate = asyncio.Event()
    try:

        async def held(peer: Peer, _: int) -> None:
            while await peer.request() is not None:
                await gate.wait()
                await peer.answer(ok())

        async with upstream(held) as up:
            calls = [asyncio.create_task(_get(client, up.url + "/")) for _ in range(3)]
            await eventually(lambda: len(up.peers) == 3, what="three connections")
            gate.set()
            await asyncio.gather(*calls)
            await eventually(
                lambda: sum(p.reader.at_eof() for p in up.peers) == 2, what="two closed"
            )
    finally:
        await client.close()


async def test_the_limit_bounds_connections_in_use_and_the_rest_wait() -> None:
    client = UpstreamClient(limit=2)
    await client.start()
    busy = 0
    most = 0

    async def slow(peer: Peer, _: int) -> None:
        nonlocal busy, most
        while await peer.request() is not None:
            busy += 1
            most = max(most, busy)
            await asyncio.sleep(0.02)
            busy -= 1
            await peer.answer(ok())

    try:
        async with upstream(slow) as up:
            bodies = await asyncio.gather(*(_get(client, up.url + "/") for _ in range(6)))
    finally:
        await client.close()
    assert [b"hello"] * 6 == bodies
    assert 2 == most
    assert len(up.peers) <= 2


async def test_a_slow_reader_pauses_the_upstream_socket_and_gets_every_byte(
    client: UpstreamClient,
) -> None:
    body = bytes(range(256)) * 4096 * 8  # 8 MiB
    sent = asyncio.Event()

    async def flood(peer: Peer, _: int) -> None:
        await peer.request()
        peer.writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await peer.writer.drain()
        sent.set()

    async with upstream(flood) as up:
        response = await client.send("GET", up.url + "/", [], None, TIMEOUTS)
        await asyncio.sleep(0.2)  # the reader does nothing: the client must stop reading
        buffered = response._buffered
        assert not sent.is_set()  # the server is blocked on its own send buffer
        got = await response.read()
        response.release()
        await asyncio.wait_for(sent.wait(), 5)
    assert buffered <= http1.PAUSE_BYTES + 256 * 1024  # a read's worth past the mark at most
    assert body == got


async def test_releasing_a_response_mid_body_closes_its_connection(client: UpstreamClient) -> None:
    async def stream_forever(peer: Peer, _: int) -> None:
        await peer.request()
        await peer.answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(100):
            await peer.answer(b"6\r\ndata:\n\r\n")
            await asyncio.sleep(0.01)

    async with upstream(stream_forever) as up:
        response = await client.send("POST", up.url + "/", [], b"{}", TIMEOUTS)
        assert await response.read_chunk()
        response.release()
        await eventually(up.peers[0].writer.is_closing, what="upstream saw the close")
        with pytest.raises(UpstreamError):
            await response.read_chunk()


async def test_a_request_cancelled_while_waiting_for_its_head_closes_the_connection(
    client: UpstreamClient,
) -> None:
    async def never(peer: Peer, _: int) -> None:
        await peer.request()
        await peer.wait_closed_by_client()

    async with upstream(never) as up:
        call = asyncio.create_task(client.send("POST", up.url + "/", [], b"{}", TIMEOUTS))
        await eventually(lambda: len(up.peers) == 1, what="connected")
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await eventually(lambda: up.peers[0].closed_by_client, what="connection closed")
    assert "in_use=0" in repr(client)


async def test_close_closes_every_connection_idle_or_busy() -> None:
    client = UpstreamClient()
    await client.start()

    async def answer_the_second_only(peer: Peer, index: int) -> None:
        await peer.request()
        if index == 1:
            await peer.answer(ok())
        await peer.wait_closed_by_client()

    async with upstream(answer_the_second_only) as up:
        busy = asyncio.create_task(client.send("POST", up.url + "/", [], b"{}", TIMEOUTS))
        await eventually(lambda: len(up.peers) == 1, what="the first connection")
        await _get(client, up.url + "/")  # on a second connection, idle from now on
        await client.close()
        await eventually(lambda: all(p.closed_by_client for p in up.peers), what="all closed")
        with pytest.raises(UpstreamError):
            await busy
    assert "<UpstreamClient closed>" == repr(client)


async def test_an_upstream_talking_out_of_turn_on_an_idle_connection_loses_it(
    client: UpstreamClient,
) -> None:
    async def chatty(peer: Peer, _: int) -> None:
        await peer.request()
        await peer.answer(ok())
        await asyncio.sleep(0.05)
        await peer.answer(b"HTTP/1.1 200 OK\r\n\r\n")  # unasked
        await peer.wait_closed_by_client()

    async with upstream(chatty) as up:
        await _get(client, up.url + "/")
        await eventually(lambda: up.peers[0].closed_by_client, what="the chatty one closed")
        await _get(client, up.url + "/")
    assert 2 == len(up.peers)


async def test_a_request_waiting_for_a_free_connection_is_bounded_by_its_first_byte_time() -> None:
    client = UpstreamClient(limit=1)
    await client.start()
    gate = asyncio.Event()

    async def held(peer: Peer, _: int) -> None:
        while await peer.request() is not None:
            await gate.wait()
            await peer.answer(ok())

    try:
        async with upstream(held) as up:
            holder = asyncio.create_task(_get(client, up.url + "/"))
            await eventually(lambda: len(up.peers) == 1, what="the one connection")
            with pytest.raises(UpstreamTimeout, match="sent no response"):
                await client.send("POST", up.url + "/", [], b"{}", Timeouts(1, 0.2, 5))
            waiter = asyncio.create_task(_get(client, up.url + "/"))
            await eventually(lambda: len(client._limit._waiters) == 1, what="in line")
            waiter.cancel()  # gave up waiting: its place in line is gone, no slot leaks
            gate.set()
            assert b"hello" == await holder
            assert b"hello" == await _get(client, up.url + "/")
            assert "in_use=0" in repr(client)
    finally:
        await client.close()
    assert 1 == len(up.peers)
