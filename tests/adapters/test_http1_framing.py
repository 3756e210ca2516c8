"""How a response's body is delimited, read through the data plane's client against a raw
upstream: Content-Length, chunked, close-delimited, none (HEAD, 204, 304), interim 1xx heads,
and the answers that are refused or break off."""

from __future__ import annotations

import pytest
from raw_upstream import TIMEOUTS, Peer, keep_alive, ok, upstream

from gpugate.adapters import http1
from gpugate.adapters.upstream_client import UpstreamClient
from gpugate.errors import UpstreamError, UpstreamUnreachable
from harness import eventually


async def test_a_content_length_body_is_read_whole_and_the_connection_is_reused(
    client: UpstreamClient,
) -> None:
    async with upstream(keep_alive(ok(b"x" * 1000))) as up:
        bodies = []
        for _ in range(3):
            response = await client.send("POST", up.url + "/v1/x", [], b"{}", TIMEOUTS)
            bodies.append(await response.read())
            assert response.at_eof()
            response.release()
    assert [b"x" * 1000] * 3 == bodies
    assert 1 == len(up.peers)


async def test_a_chunked_body_arrives_piece_by_piece_and_the_connection_is_reused(
    client: UpstreamClient,
) -> None:
    async def chunked(peer: Peer, _: int) -> None:
        while await peer.request() is not None:
            await peer.answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for piece in (b"data: 1\n\n", b"data: 2\n\n"):
                await peer.answer(b"%x\r\n%s\r\n" % (len(piece), piece))
            await peer.answer(b"0\r\n\r\n")

    async with upstream(chunked) as up:
        for _ in range(2):
            response = await client.send("POST", up.url + "/s", [], b"{}", TIMEOUTS)
            body = await response.read()
            response.release()
            assert b"data: 1\n\ndata: 2\n\n" == body
            assert "transfer-encoding" not in {k.decode() for k, _ in response.headers}
    assert 1 == len(up.peers)


async def test_a_close_delimited_body_ends_with_the_connection_which_is_not_reused(
    client: UpstreamClient,
) -> None:
    async def until_close(peer: Peer, _: int) -> None:
        await peer.request()
        await peer.answer(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npart one, ")
        await peer.answer(b"part two")
        peer.writer.close()

    async with upstream(until_close) as up:
        bodies = []
        for _ in range(2):
            response = await client.send("GET", up.url + "/", [], None, TIMEOUTS)
            bodies.append(await response.read())
            response.release()
    assert [b"part one, part two"] * 2 == bodies
    assert 2 == len(up.peers)


@pytest.mark.parametrize(
    ("method", "answer"),
    [
        ("HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n"),
        ("GET", b"HTTP/1.1 204 No Content\r\n\r\n"),
        ("GET", b"HTTP/1.1 304 Not Modified\r\nContent-Length: 1234\r\n\r\n"),
    ],
)
async def test_head_204_and_304_answers_have_no_body(
    client: UpstreamClient, method: str, answer: bytes
) -> None:
    async with upstream(keep_alive(answer)) as up:
        response = await client.send(method, up.url + "/", [], None, TIMEOUTS)
        body = await response.read()
        response.release()
        again = await client.send("GET", up.url + "/", [], None, TIMEOUTS)
        again.release()
    assert b"" == body
    assert response.at_eof()


async def test_interim_1xx_heads_are_skipped_for_the_final_one(client: UpstreamClient) -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
    async with upstream(keep_alive(interim + ok(b"final", b"X-Final: yes"))) as up:
        response = await client.send("POST", up.url + "/", [], b"{}", TIMEOUTS)
        body = await response.read()
        response.release()
    assert (200, b"final") == (response.status, body)
    assert (b"x-final", b"yes") in response.headers
    assert b"link" not in {k for k, _ in response.headers}


async def test_a_response_head_over_the_limit_is_refused_before_responding(
    client: UpstreamClient,
) -> None:
    async def huge_head(peer: Peer, _: int) -> None:
        await peer.request()
        await peer.answer(b"HTTP/1.1 200 OK\r\n")
        for i in range(http1.MAX_HEAD_BYTES // 1000 + 2):
            await peer.answer(b"X-Pad-%d: %s\r\n" % (i, b"p" * 1000))
        await peer.wait_closed_by_client()

    async with upstream(huge_head) as up:
        with pytest.raises(UpstreamUnreachable, match="larger than 65536 bytes") as caught:
            await client.send("GET", up.url + "/", [], None, TIMEOUTS, label="u")
        await eventually(lambda: up.peers[0].closed_by_client, what="connection closed")
    assert "u failed before responding" in str(caught.value)
    assert not caught.value.connect_failed


async def test_an_unparsable_answer_fails_before_responding(client: UpstreamClient) -> None:
    async with upstream(keep_alive(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")) as up:
        with pytest.raises(UpstreamUnreachable, match="an invalid response"):
            await client.send("GET", up.url + "/", [], None, TIMEOUTS)


async def test_a_body_that_ends_before_its_length_breaks_off(client: UpstreamClient) -> None:
    async def short(peer: Peer, _: int) -> None:
        await peer.request()
        await peer.answer(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")
        peer.writer.close()

    async with upstream(short) as up:
        response = await client.send("GET", up.url + "/", [], None, TIMEOUTS)
        first = await response.read_chunk()
        with pytest.raises(UpstreamError, match="broke off"):
            await response.read_chunk()
        response.release()
    assert b"only ten b" == first
    assert not response.at_eof()


async def test_a_chunked_body_cut_before_its_last_chunk_breaks_off(client: UpstreamClient) -> None:
    async def cut(peer: Peer, _: int) -> None:
        await peer.request()
        await peer.answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        peer.writer.close()

    async with upstream(cut) as up:
        response = await client.send("GET", up.url + "/", [], None, TIMEOUTS)
        with pytest.raises(UpstreamError, match="broke off"):
            await response.read()
        response.release()


async def test_a_reset_mid_body_breaks_off_even_without_a_length(client: UpstreamClient) -> None:
    """A close-delimited body ends with a FIN; a reset is a break, not an end."""

    async def reset(peer: Peer, _: int) -> None:
        await peer.request()
        await peer.answer(b"HTTP/1.1 200 OK\r\n\r\nsome of it")
        peer.reset()

    async with upstream(reset) as up:
        response = await client.send("GET", up.url + "/", [], None, TIMEOUTS)
        with pytest.raises(UpstreamError, match="broke off"):
            await response.read()
        response.release()


async def test_hop_by_hop_and_connection_named_response_headers_are_dropped(
    client: UpstreamClient,
) -> None:
    extra = (
        b"Connection: keep-alive, X-Hop",
        b"X-Hop: secret",
        b"Keep-Alive: timeout=5",
        b"X-Kept: 1",
    )
    async with upstream(keep_alive(ok(b"{}", *extra))) as up:
        response = await client.send("GET", up.url + "/", [], None, TIMEOUTS)
        response.release()
    assert [(b"content-length", b"2"), (b"x-kept", b"1")] == response.headers


async def test_a_second_answer_to_one_request_makes_the_connection_unusable(
    client: UpstreamClient,
) -> None:
    """Bytes after a complete answer (written with it, in one packet) are an answer to nothing."""

    async def twice(peer: Peer, _: int) -> None:
        while await peer.request() is not None:
            await peer.answer(ok(b"one") + ok(b"two"))

    async with upstream(twice) as up:
        for _ in range(2):
            response = await client.send("GET", up.url + "/", [], None, TIMEOUTS)
            assert b"one" == await response.read()
            response.release()
    assert 2 == len(up.peers)
