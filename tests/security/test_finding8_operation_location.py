"""Finding 8 (issue #15): the Azure DI facade built ``Operation-Location`` from whatever ``Host``
the client sent, so a forged ``Host`` (through a shared proxy or cache) pointed a client's polls
— and the key it sends with them — at another server.

``server.public_url`` now sets the base; without it, only a loopback or the ``listen`` host is
taken from ``Host``, and any other is refused with 400 before anything reaches the resource.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from facade.fake_di import FakeDocumentIntelligence
from harness import RunningGateway, make_config, serving, upstream

KEY = "di-key-for-the-gateway"
ANALYZE = "/azure-di/documentintelligence/documentModels/prebuilt-read:analyze"


@contextlib.asynccontextmanager
async def di_gateway(
    sqlite_dsn: str, **server: Any
) -> AsyncIterator[tuple[RunningGateway, FakeDocumentIntelligence]]:
    async with FakeDocumentIntelligence(KEY) as fake:
        azure = upstream("azure", [fake.url], ["prebuilt-read"], kind="azure-di", api_key_env="K")
        config = make_config(
            sqlite_dsn, [upstream("u", ["http://127.0.0.1:9"], ["m"]), azure], server=server
        )
        async with serving(config, environ={"K": KEY}) as gw:
            yield gw, fake


async def analyze(gw: RunningGateway, host: str | None) -> tuple[int, str | None]:
    headers = {"Host": host} if host else {}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            gw.url + ANALYZE,
            params={"api-version": "2024-11-30"},
            data=b"%PDF-1.4",
            headers={"content-type": "application/pdf", **headers},
        ) as resp:
            await resp.read()
            return resp.status, resp.headers.get("Operation-Location")


async def test_finding8_a_forged_host_is_refused_before_the_resource_sees_anything(
    sqlite_dsn: str,
) -> None:
    async with di_gateway(sqlite_dsn) as (gw, fake):
        status, location = await analyze(gw, "attacker.example:443")
    assert (400, None, []) == (status, location, fake.seen)


async def test_finding8_operation_location_is_built_on_the_configured_public_url(
    sqlite_dsn: str,
) -> None:
    public = "https://gpu.example.com"
    async with di_gateway(sqlite_dsn, public_url=public) as (gw, _):
        status, location = await analyze(gw, "attacker.example:443")
    assert 202 == status
    assert location is not None
    assert location.startswith(f"{public}/azure-di/documentintelligence/documentModels/")


async def test_without_public_url_a_loopback_host_keeps_working(sqlite_dsn: str) -> None:
    async with di_gateway(sqlite_dsn) as (gw, _):
        status, location = await analyze(gw, None)
    assert 202 == status
    assert location is not None
    assert location.startswith(gw.url + "/azure-di/")
