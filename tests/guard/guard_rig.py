"""A gateway with one push runtime (``home-1``) in front of its own upstream runtime (``local``),
and a push worker on loopback whose every answer the test decides, for the guardrails tests.

:class:`FakeWorker` speaks the push protocol (DESIGN §3) on a real socket: it accepts a call
(``202 {call_id}``) and holds it — it never reports, so the call stays in flight until the
gateway cancels it (``DELETE``, counted in ``cancelled``) — or refuses with ``refuse_status``
once ``accept`` calls were taken; ``GET`` answers ``states[call_id]`` (default ``running``).
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from gpugate.config import GatewayConfig
from harness import make_config, upstream
from push.fake_worker import signs_answers

TOKEN = "guard-admin-token"
ENV = {"GPUGATE_ADMIN_TOKEN": TOKEN, "HOME1_SECRET": "secret-of-home-1"}
CHAT = {"messages": [{"role": "user", "content": "hello"}]}


class FakeWorker:
    """A push worker that holds every call it accepts; see the module docstring."""

    def __init__(self, *, accept: int | None = None, refuse_status: int = 401) -> None:
        self.accept = accept
        self.refuse_status = refuse_status
        self.calls: dict[str, str] = {}  # call_id -> slug
        self.states: dict[str, str] = {}
        self.cancelled: list[str] = []
        self.refused = 0
        self._ids = itertools.count(1)
        self.url = ""

    async def _submit(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.accept is not None and len(self.calls) >= self.accept:
            self.refused += 1
            return web.json_response({"error": "token expired"}, status=self.refuse_status)
        call_id = f"call-{next(self._ids)}"
        self.calls[call_id] = body["slug"]
        return web.json_response({"call_id": call_id}, status=202)

    async def _status(self, request: web.Request) -> web.Response:
        call_id = request.match_info["call_id"]
        return web.json_response({"state": self.states.get(call_id, "running")})

    async def _cancel(self, request: web.Request) -> web.Response:
        self.cancelled.append(request.match_info["call_id"])
        return web.json_response({})

    def call_of(self, slug: str) -> str:
        return next(call for call, held in self.calls.items() if held == slug)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[FakeWorker]:
        app = web.Application(middlewares=[signs_answers(ENV["HOME1_SECRET"])])
        app.router.add_post("/calls", self._submit)
        app.router.add_get("/calls/{call_id}", self._status)
        app.router.add_delete("/calls/{call_id}", self._cancel)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/calls"
        try:
            yield self
        finally:
            await runner.cleanup()


def guard_config(
    dsn: str,
    model_url: str,
    worker_url: str,
    *,
    stop: dict[str, Any] | None = None,
    jobs: dict[str, Any] | None = None,
    budget: dict[str, Any] | None = None,
) -> GatewayConfig:
    """``home-1`` (push, ``worker_url``) first in the chain, then ``local`` (the upstream)."""
    home: dict[str, Any] = {
        "id": "home-1",
        "kind": "push",
        "models": ["qwen"],
        "push": {"url": worker_url, "secret_env": "HOME1_SECRET"},
        "max_concurrency": 10,
    }
    if budget is not None:
        home["budget"] = budget
    return make_config(
        dsn,
        [upstream("q0", [model_url], ["qwen"])],
        admin_token_env="GPUGATE_ADMIN_TOKEN",
        runtimes=[home, {"id": "local", "kind": "upstream"}],
        fallback_chain=["home-1", "local"],
        default_runtime="home-1",
        stop_conditions=stop or {},
        jobs={"sweep_s": 0.2, "reap_s": 0.05, **(jobs or {})},
        server={"config_poll_s": 0.1},
    )


async def create_job(http: aiohttp.ClientSession, url: str, slug: str) -> None:
    body = {"model": "qwen", "input": CHAT, "slug": slug}
    headers = {"Idempotency-Key": f"key-{slug}"}
    async with http.post(url + "/v1/jobs", json=body, headers=headers) as resp:
        assert 202 == resp.status, await resp.text()


async def admin_get(http: aiohttp.ClientSession, url: str, path: str) -> Any:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with http.get(url + path, headers=headers) as resp:
        assert 200 == resp.status, await resp.text()
        return await resp.json()


async def metric(http: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    """One sample of ``/metrics`` (0 when absent)."""
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{re.escape(name)}(?:\{{{re.escape(wanted)}\}})? (\S+)$"
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0
