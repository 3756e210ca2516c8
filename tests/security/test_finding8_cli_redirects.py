"""Finding 8 (issue #15): the CLI followed a redirect to any host with the admin token.

Two real HTTP servers on loopback stand for the gateway and another origin; the CLI's client
(the one every ``gpugate runtimes|config|jobs`` command uses) talks to the first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from gpugate.adapters.gateway_api import GatewayApi
from gpugate.errors import GpugateError

TOKEN = "admin-token-for-the-gateway-only"


@dataclass
class Site:
    """A loopback server that redirects ``/admin/runtimes`` to ``moved_to`` (when set) and
    records what authorization each request carried."""

    moved_to: str | None = None
    seen: list[str | None] = field(default_factory=list)
    url: str = ""


@contextlib.asynccontextmanager
async def site(moved_to: str | None = None) -> AsyncIterator[Site]:
    state = Site(moved_to)

    async def handle(request: web.Request) -> web.StreamResponse:
        state.seen.append(request.headers.get("Authorization"))
        if request.path == "/admin/runtimes" and state.moved_to is not None:
            return web.Response(status=302, headers={"Location": state.moved_to})
        return web.json_response({"runtimes": []})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield state
    finally:
        await runner.cleanup()


async def test_finding8_the_cli_refuses_a_redirect_to_another_origin_and_sends_it_nothing() -> None:
    async with site() as elsewhere:
        async with site(elsewhere.url + "/steal") as gateway:
            api = GatewayApi(gateway.url, token=TOKEN)
            with pytest.raises(GpugateError, match="redirected to another origin"):
                await asyncio.to_thread(api.request, "GET", "/admin/runtimes")
    assert ([f"Bearer {TOKEN}"], []) == (gateway.seen, elsewhere.seen)


async def test_a_redirect_within_the_gateways_origin_is_followed_with_the_token() -> None:
    async with site() as gateway:
        gateway.moved_to = gateway.url + "/admin/runtimes/"
        api = GatewayApi(gateway.url, token=TOKEN)
        status, body = await asyncio.to_thread(api.request, "GET", "/admin/runtimes")
    assert (200, {"runtimes": []}) == (status, body)
    assert [f"Bearer {TOKEN}", f"Bearer {TOKEN}"] == gateway.seen
