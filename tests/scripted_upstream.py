"""A model server whose every answer a test scripts: a real aiohttp server on a loopback port.

The simulated fleet (``gpugate.fleet``) has knobs for whole behaviours; the proxy's retry tests
need the n-th request answered a given way ("500 once, then fine"), so this server takes a list
of steps and answers request *n* with step *n* (the last step repeats). It records when each
request arrived and what it carried, which is what the tests pin the rescues by.

Imported by tests as ``from scripted_upstream import ...`` (``tests/`` is on pytest's pythonpath).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass(frozen=True)
class Step:
    """How to answer one request.

    - ``status``/``headers``/``error``: answer this status with an OpenAI-shaped error body (or
      ``body`` verbatim) instead of a completion.
    - ``drop``: close the connection before any byte of answer.
    - ``hang_s``: wait this long before anything (the headers too).
    - ``events``: for a stream, how many content events to send before ``cut`` / ``stall_s``.
    - ``cut``: after ``events`` content events, abort the connection (a stream cut mid-way).
    - ``stall_s``: after ``events`` content events, go silent this long.
    - ``first_event_error``: a stream answers 200 and then an error event first.
    - ``no_done``: end the stream without ``data: [DONE]``.
    - ``garbage_at``: the content event with this index is not JSON.
    - ``end``: after ``events`` content events, end the stream cleanly (no finish, no [DONE]).
    - ``words``: answer these words (a server that is not deterministic after all).
    """

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    error: str = "scripted failure"
    code: str | None = None
    body: bytes | None = None
    drop: bool = False
    hang_s: float = 0.0
    events: int | None = None
    cut: bool = False
    stall_s: float = 0.0
    first_event_error: bool = False
    no_done: bool = False
    garbage_at: int | None = None
    delay_s: float = 0.0
    end: bool = False
    words: tuple[str, ...] | None = None  # this answer's words instead of the server's
    crlf: bool = False  # frame events with CRLF (sse-starlette's default)


OK = Step()


@dataclass
class Seen:
    """One request as the server saw it."""

    at: float  # time.monotonic() on arrival
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)  # lower-cased names


@dataclass
class Scripted:
    """The running server: its URL, the script, and what it saw."""

    url: str
    steps: list[Step]
    name: str
    words: list[str]
    seen: list[Seen] = field(default_factory=list)
    #: Until this time.monotonic(), every request is answered 503 (an outage), then the script.
    down_until: float = 0.0

    @property
    def count(self) -> int:
        return len(self.seen)

    def step(self, n: int) -> Step:
        return self.steps[min(n, len(self.steps) - 1)]


def answer_text(words: list[str]) -> str:
    return "".join(words)


async def _handle(request: web.Request) -> web.StreamResponse:  # noqa: C901, PLR0911, PLR0912
    server = request.app[_SERVER]
    raw = await request.read()
    body = json.loads(raw or b"{}")
    n = server.count
    headers = {k.lower(): v for k, v in request.headers.items()}
    server.seen.append(Seen(time.monotonic(), body, headers))
    step = server.step(n) if time.monotonic() >= server.down_until else Step(status=503)
    if step.hang_s:
        await asyncio.sleep(step.hang_s)
    if step.drop:
        assert request.transport is not None
        request.transport.abort()
        return web.Response()
    if step.delay_s:
        await asyncio.sleep(step.delay_s)
    model = body.get("model", "m")
    if step.status != 200:
        payload = (
            step.body
            or json.dumps(
                {"error": {"message": step.error, "type": "scripted", "code": step.code}}
            ).encode()
        )
        return web.Response(
            status=step.status,
            body=payload,
            headers={"Content-Type": "application/json", **dict(step.headers)},
        )
    words = list(step.words) if step.words is not None else _words_for(server, body)
    if not body.get("stream"):
        doc = {
            "id": f"cmpl-{server.name}-{n}",
            "object": "chat.completion",
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(words)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": len(words), "total_tokens": 1},
        }
        return web.json_response(doc)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    end = b"\r\n\r\n" if step.crlf else b"\n\n"
    if step.first_event_error:
        error = {"error": {"message": "overloaded", "type": "server_error", "code": 503}}
        await response.write(b"data: " + json.dumps(error).encode() + end)
        return response
    for i, word in enumerate(words):
        if step.events is not None and i == step.events:
            if step.cut:
                assert request.transport is not None
                request.transport.abort()
                return response
            if step.end:
                await response.write_eof()
                return response
            if step.stall_s:
                await asyncio.sleep(step.stall_s)
        chunk = {
            "id": f"chatcmpl-{server.name}-{n}",
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
        }
        data = json.dumps(chunk).encode()
        if step.garbage_at == i:
            data = data[: len(data) // 2]  # an event cut off in the middle
        await response.write(b"data: " + data + end)
    final = {
        "id": f"chatcmpl-{server.name}-{n}",
        "object": "chat.completion.chunk",
        "model": model,
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    }
    await response.write(b"data: " + json.dumps(final).encode() + end)
    await _usage(response, body, f"chatcmpl-{server.name}-{n}", len(words), end)
    if not step.no_done:
        await response.write(b"data: [DONE]" + end)
    return response


async def _usage(
    response: web.StreamResponse, body: dict[str, Any], cid: str, n: int, end: bytes
) -> None:
    """The usage event before ``[DONE]`` when the request asked for it, as OpenAI and vLLM do."""
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
        chunk = {"id": cid, "model": body.get("model", "m"), "choices": [], "usage": usage}
        await response.write(b"data: " + json.dumps(chunk).encode() + end)


def _words_for(server: Scripted, body: dict[str, Any]) -> list[str]:
    """The answer's words; a trailing assistant message (a prefill) is continued, not repeated."""
    messages = body.get("messages") or []
    if messages and messages[-1].get("role") == "assistant":
        done = messages[-1].get("content", "")
        full = answer_text(server.words)
        assert full.startswith(done), "a prefill must be a prefix of the answer"
        rest = full[len(done) :]
        return [rest[i : i + 4] for i in range(0, len(rest), 4)] or [""]
    return list(server.words)


async def _health(_: web.Request) -> web.Response:
    return web.json_response({"ok": True})


WORDS = [f"w{i:02d} " for i in range(60)]
_SERVER = web.AppKey("server", Scripted)


@asynccontextmanager
async def scripted(
    *steps: Step, name: str = "s", words: list[str] | None = None, sock: socket.socket | None = None
) -> AsyncIterator[Scripted]:
    """Serve the script on 127.0.0.1 (or on ``sock``, bound already) until the block ends."""
    app = web.Application()
    server = Scripted("", list(steps) or [OK], name, list(words or WORDS))
    app[_SERVER] = server
    app.router.add_post("/v1/chat/completions", _handle)
    app.router.add_post("/v1/completions", _handle)
    app.router.add_get("/health", _health)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    sockets = site._server.sockets  # type: ignore[union-attr]
    server.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    try:
        yield server
    finally:
        await runner.cleanup()
