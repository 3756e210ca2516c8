"""What the identity tests share: a keyed gateway, and creating keys through the admin API."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from harness import make_config, upstream

TOKEN = "s3cret-admin"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
ENVIRON = {"GPUGATE_ADMIN_TOKEN": TOKEN}


def keyed_config(
    dsn: str,
    urls: list[str],
    models: list[str],
    *,
    extra: dict[str, Any] | None = None,
    **more: Any,
) -> Any:
    """A config in ``auth.mode: keys`` with one upstream ``u`` serving ``models`` (``extra``:
    more top-level keys, e.g. ``models`` policies)."""
    auth = {"mode": "keys", **more.pop("auth", {})}
    return make_config(dsn, [upstream("u", urls, models)], auth=auth, **more, **(extra or {}))


async def create_key(http: aiohttp.ClientSession, url: str, **fields: Any) -> dict[str, Any]:
    """A new key through ``POST /admin/keys``; its view with the secret (``key``)."""
    body = {"name": "app", "tenant": "team-a", **fields}
    async with http.post(url + "/admin/keys", json=body, headers=ADMIN) as resp:
        assert 201 == resp.status, await resp.text()
        created: dict[str, Any] = await resp.json()
    return created


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def chat(model: str = "m", text: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


@contextlib.asynccontextmanager
async def recording_upstream() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A minimal OpenAI-compatible server on a free port that records every request's headers
    (the fake model server does not): its URL and the list it appends to."""
    seen: list[dict[str, str]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        body = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
        return web.Response(body=json.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()
