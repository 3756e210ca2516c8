"""A fake push worker on a free loopback port: answers what the test scripts, records what it
was sent. It stands for ``gpugate worker`` where a test pins the gateway's side alone.

Given the runtime's ``secret`` it signs its answers to signed requests, as a real worker does
(:func:`signs_answers`); without one it is a wave-1 worker that speaks only bearer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web

from gpugate import push_signature

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def signs_answers(secret: str) -> Any:
    """An aiohttp middleware that signs each answer to a signed request with ``secret``'s
    worker-to-gateway key, bound to that request's nonce (the push protocol's answers)."""
    key = push_signature.derive_key(secret, push_signature.WORKER_TO_GATEWAY)

    @web.middleware
    async def sign(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        header = request.headers.get(push_signature.HEADER)
        if header and isinstance(response, web.Response):
            body = response.body if isinstance(response.body, bytes) else b""
            response.headers[push_signature.HEADER] = push_signature.sign_response(
                key,
                push_signature.WORKER_TO_GATEWAY,
                request_nonce=push_signature.request_nonce(header),
                status=response.status,
                body=body,
            )
        return response

    return sign


@dataclass
class Scripted:
    """One answer: ``status`` and JSON ``body``, after ``delay_s``."""

    status: int
    body: Any = None
    delay_s: float = 0.0


@dataclass
class Received:
    method: str
    path: str
    authorization: str | None
    body: Any
    signature: str | None = None


@dataclass
class FakeWorker:
    """``POST /calls``, ``GET|DELETE /calls/{id}``; ``answers[(method, path)]`` overrides the
    defaults (202 with a call id; the status in ``statuses``, else 404 unknown)."""

    answers: dict[tuple[str, str], Scripted] = field(default_factory=dict)
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    url: str = ""
    secret: str | None = None  # set: answers are signed (a worker of a push.auth: signed runtime)
    _runner: web.AppRunner | None = None

    async def __aenter__(self) -> Self:
        app = web.Application(middlewares=[signs_answers(self.secret)] if self.secret else [])
        app.router.add_route("*", "/calls", self._handle)
        app.router.add_route("*", "/calls/{call_id}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{port}/calls"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        self.received.append(
            Received(
                request.method,
                request.path,
                request.headers.get("Authorization"),
                body,
                request.headers.get(push_signature.HEADER),
            )
        )
        scripted = self.answers.get((request.method, request.path))
        if scripted is not None:
            await asyncio.sleep(scripted.delay_s)
            return web.json_response(scripted.body, status=scripted.status)
        if request.method == "POST":
            return web.json_response({"call_id": f"call-{len(self.received)}"}, status=202)
        call_id = request.match_info["call_id"]
        if request.method == "DELETE":
            return web.Response(status=204)
        if call_id in self.statuses:
            return web.json_response(self.statuses[call_id])
        return web.json_response({"state": "unknown"}, status=404)
