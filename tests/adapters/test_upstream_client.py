"""What the data plane's client puts on the wire and how its failures read: the request head
(Host, the target as given, the headers forwarded and dropped, the body's framing), HTTPS with
the system's verification and SNI, and the errors clients may see (no address in them)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
from raw_upstream import TIMEOUTS, Request, keep_alive, ok, upstream

from gpugate.adapters.upstream_client import UpstreamClient
from gpugate.errors import GatewayOverloaded, UpstreamUnreachable


async def _sent(
    client: UpstreamClient,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes | AsyncIterator[bytes] | None,
    host: str = "127.0.0.1",
) -> Request:
    """The request as the upstream received it."""
    seen: list[Request] = []
    async with upstream(keep_alive(ok(), seen), host=host) as up:
        base = up.url if host == "127.0.0.1" else f"http://[{host}]:{up.port}"
        response = await client.send(method, base + path, headers, body, TIMEOUTS)
        await response.read()
        response.release()
    return seen[0]


async def test_the_request_line_keeps_the_target_as_given_and_host_names_the_origin(
    client: UpstreamClient,
) -> None:
    request = await _sent(client, "GET", "/base/v1/files/a%20b;c=d?q=a%20b&x=1", [], None)
    assert b"GET /base/v1/files/a%20b;c=d?q=a%20b&x=1 HTTP/1.1" == request.line
    assert [b"127.0.0.1:%d" % int(request.header(b"host")[0].split(b":")[1])] == request.header(
        b"host"
    )


async def test_a_space_or_a_non_ascii_character_in_the_target_is_percent_encoded(
    client: UpstreamClient,
) -> None:
    request = await _sent(client, "GET", "/v1/a b/é?q=1 2", [], None)
    assert b"GET /v1/a%20b/%C3%A9?q=1%202 HTTP/1.1" == request.line


async def test_a_query_without_a_path_gets_the_root_path(client: UpstreamClient) -> None:
    seen: list[Request] = []
    async with upstream(keep_alive(ok(), seen)) as up:
        response = await client.send("GET", up.url + "?probe=1", [], None, TIMEOUTS)
        response.release()
    assert b"GET /?probe=1 HTTP/1.1" == seen[0].line


async def test_an_ipv6_literal_is_reached_and_named_in_brackets(client: UpstreamClient) -> None:
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("no IPv6 loopback here")
    request = await _sent(client, "GET", "/v1/models", [], None, host="::1")
    assert request.header(b"host")[0].startswith(b"[::1]:")


async def test_hop_by_hop_connection_named_host_and_length_headers_are_not_forwarded(
    client: UpstreamClient,
) -> None:
    headers = [
        (b"host", b"client.example"),
        (b"content-length", b"999"),
        (b"connection", b"keep-alive, X-Hop-Secret"),
        (b"x-hop-secret", b"s3cr3t"),
        (b"te", b"trailers"),
        (b"transfer-encoding", b"chunked"),
        (b"upgrade", b"h2c"),
        (b"Authorization", b"Bearer k"),
        (b"x-request-id", b"r1"),
    ]
    request = await _sent(client, "POST", "/v1/chat/completions", headers, b'{"a":1}')
    names = [line.split(b":")[0].lower() for line in request.head.split(b"\r\n")[1:]]
    assert [b"host", b"authorization", b"x-request-id", b"content-length"] == names
    assert [b"7"] == request.header(b"content-length")
    assert b'{"a":1}' == request.body


@pytest.mark.parametrize(
    ("method", "length"), [("POST", [b"0"]), ("PUT", [b"0"]), ("GET", []), ("HEAD", [])]
)
async def test_a_bodyless_request_says_content_length_0_unless_its_method_has_no_body(
    client: UpstreamClient, method: str, length: list[bytes]
) -> None:
    request = await _sent(client, method, "/", [], None)
    assert length == request.header(b"content-length")


async def test_a_body_in_pieces_is_sent_chunked(client: UpstreamClient) -> None:
    async def pieces() -> AsyncIterator[bytes]:
        for piece in (b'{"a":', b"", b"1}"):
            yield piece

    request = await _sent(client, "POST", "/", [], pieces())
    assert [b"chunked"] == request.header(b"transfer-encoding")
    assert b'{"a":1}' == request.body


@pytest.mark.parametrize("bad", [b"v\r\nX-Injected: 1", b"v\nx", b"v\rx"])
async def test_a_line_break_in_a_header_value_is_refused(
    client: UpstreamClient, bad: bytes
) -> None:
    async with upstream(keep_alive(ok())) as up:
        with pytest.raises(ValueError, match="line break"):
            await client.send("GET", up.url + "/", [(b"x-a", bad)], None, TIMEOUTS)
    assert [] == up.peers


async def test_credentials_in_the_url_are_sent_as_basic_authorization(
    client: UpstreamClient,
) -> None:
    seen: list[Request] = []
    async with upstream(keep_alive(ok(), seen)) as up:
        url = f"http://us%40er:p%3Ass@127.0.0.1:{up.port}/v1"
        response = await client.send("GET", url, [(b"authorization", b"x")], None, TIMEOUTS)
        response.release()
    assert [b"Basic dXNAZXI6cDpzcw=="] == seen[0].header(b"authorization")  # us@er:p:ss


async def test_a_refused_connect_names_the_label_and_the_systems_reason_not_the_address(
    client: UpstreamClient,
) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(UpstreamUnreachable) as caught:
        await client.send("GET", f"http://127.0.0.1:{port}/x", [], None, TIMEOUTS, label="up-a")
    assert "cannot connect to up-a: Connection refused" == str(caught.value)
    assert caught.value.connect_failed


@contextlib.asynccontextmanager
async def tls_upstream(tmp_path: Path) -> AsyncIterator[tuple[int, Path, list[str | None]]]:
    """An HTTPS upstream with a certificate for 127.0.0.1 and localhost from a throwaway CA;
    yields its port, the CA's file and the server names clients asked for (SNI)."""
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    names: list[str | None] = []
    context.sni_callback = lambda _sock, name, _ctx: names.append(name)  # type: ignore[func-returns-value]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(ok(b"secure"))
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1], ca_file, names
    finally:
        server.close()


async def test_https_verifies_against_the_system_cas_and_sends_sni(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with tls_upstream(tmp_path) as (port, ca_file, names):
        monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))  # the system's CAs, as OpenSSL reads them
        client = UpstreamClient()
        await client.start()
        try:
            for _ in range(2):
                status, body = await client.get(f"https://localhost:{port}/health", 2.0)
                assert (200, b"secure") == (status, body)
        finally:
            await client.close()
    assert ["localhost"] == names  # once: the connection was kept


async def test_https_to_a_certificate_no_system_ca_signed_fails_to_connect(
    tmp_path: Path, client: UpstreamClient
) -> None:
    async with tls_upstream(tmp_path) as (port, _, _):
        with pytest.raises(UpstreamUnreachable, match="certificate verification failed") as caught:
            await client.send("GET", f"https://127.0.0.1:{port}/", [], None, TIMEOUTS, label="s")
    assert caught.value.connect_failed
    assert "127.0.0.1" not in str(caught.value)


async def test_out_of_file_descriptors_is_the_gateways_overload_not_the_upstreams(
    client: UpstreamClient,
) -> None:
    async with upstream(keep_alive(ok())) as up:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        lowest_free = os.open(os.devnull, os.O_RDONLY)  # the number the next fd would get
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # the next fd: EMFILE
        try:
            with pytest.raises(GatewayOverloaded) as caught:
                await client.send("GET", up.url + "/", [], None, TIMEOUTS)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert 1.0 == caught.value.retry_after_s


async def test_a_url_with_an_impossible_port_is_unreachable_not_a_crash(
    client: UpstreamClient,
) -> None:
    with pytest.raises(UpstreamUnreachable, match="cannot connect to u: the URL is invalid"):
        await client.send("GET", "http://127.0.0.1:99999/x", [], None, TIMEOUTS, label="u")
