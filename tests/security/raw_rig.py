"""What the ``/u/`` tests need: an upstream that records exactly what reached it, and a client
that sends a request target byte for byte (aiohttp and every browser resolve ``..`` and re-encode
before sending, which would hide the very paths under test)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from harness import RunningGateway


@dataclass(frozen=True)
class Seen:
    method: str
    target: str  # the raw request target as it arrived (path and query, undecoded)
    headers: dict[str, str]
    body_bytes: int


@dataclass
class Recorder:
    url: str  # the base URL, with a base path (``/base``)
    seen: list[Seen] = field(default_factory=list)
    bytes_received: int = 0  # every body byte that reached it, complete requests or not


@dataclass
class Rig:
    """A gateway in front of a :class:`Recorder`."""

    gw: RunningGateway
    up: Recorder


@contextlib.asynccontextmanager
async def recording_upstream() -> AsyncIterator[Recorder]:
    """An upstream at ``http://127.0.0.1:<port>/base`` answering 200 ``{"ok": true}`` to
    anything, after reading the body; the probe's ``/base/health`` is answered, not recorded."""
    recorder = Recorder("")

    async def anything(request: web.Request) -> web.Response:
        if request.raw_path == "/base/health":  # the gateway's own probe: not a client's
            return web.json_response({"ok": True})
        size = 0
        try:
            async for chunk in request.content.iter_any():
                size += len(chunk)
                recorder.bytes_received += len(chunk)
        finally:
            recorder.seen.append(
                Seen(request.method, request.raw_path, dict(request.headers), size)
            )
        return web.json_response({"ok": True})

    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    recorder.url = f"http://127.0.0.1:{runner.addresses[0][1]}/base"
    try:
        yield recorder
    finally:
        await runner.cleanup()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error_code(self) -> str:
        code: str = json.loads(self.body)["error"]["code"]
        return code

    def json(self) -> Any:
        return json.loads(self.body)


async def send_raw(
    base_url: str,
    method: str,
    target: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    timeout_s: float = 10.0,
) -> Answer:
    """Send ``method target`` exactly as given (no normalisation) and read the whole answer."""
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        declared = any(k.lower() == "content-length" for k in headers or {})
        if not declared and (body or method in ("POST", "PUT", "PATCH")):
            lines.append(f"Content-Length: {len(body)}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        async with asyncio.timeout(timeout_s):
            data = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return parse_answer(data)


def parse_answer(data: bytes) -> Answer:
    """An HTTP/1.1 response read to the end of the connection (``Connection: close``)."""
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        rest = _dechunk(rest)
    return Answer(int(status_line.split()[1]), headers, rest)


def _dechunk(data: bytes) -> bytes:
    out = []
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out.append(data[:size])
        data = data[size + 2 :]
    return b"".join(out)


async def abort_upload(base_url: str, target: str, *, declared: int, sent: int) -> None:
    """Start a ``POST`` declaring ``declared`` body bytes, send ``sent`` of them, then give up
    (half-close), and read until the gateway closes its side too."""
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head = f"POST {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {declared}\r\n\r\n"
        writer.write(head.encode() + b"x" * sent)
        await writer.drain()
        writer.write_eof()
        async with asyncio.timeout(10):
            await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def send_chunked(base_url: str, target: str, *, chunk: bytes, chunks: int) -> Answer:
    """``POST target`` with a chunked body of ``chunks`` x ``chunk``; the answer may come
    before the whole body is sent (a refusal), so sending stops quietly if the gateway closes."""
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))

    async def upload() -> None:
        head = f"POST {target} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n"
        writer.write(head.encode())
        piece = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
        with contextlib.suppress(OSError):
            for _ in range(chunks):
                writer.write(piece)
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    sender = asyncio.create_task(upload())
    try:
        async with asyncio.timeout(20):
            head = await reader.readuntil(b"\r\n\r\n")
            answer = parse_answer(head)
            if answer.headers.get("transfer-encoding") == "chunked":
                body = _dechunk(await reader.readuntil(b"0\r\n\r\n"))
            else:
                body = await reader.readexactly(int(answer.headers.get("content-length", "0")))
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await sender
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return Answer(answer.status, answer.headers, body)
