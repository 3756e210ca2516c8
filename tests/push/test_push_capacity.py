"""A job waiting for a slot runs as soon as one frees, however it frees (DESIGN §5.3).

The audit's rig: a real gateway with its own dispatcher and reaper loops, ``local`` disabled,
push runtimes ``home-1`` (``max_concurrency`` 2) and ``home-2`` (1) in front of fake workers
that speak the bearer protocol and hold every call they accept. Three jobs fill the slots and a
fourth is deferred ``AT_CAPACITY`` for the dispatcher's 5 s backoff. A slot freed by a worker's
result always woke it at once; one freed by a cancel did not (the job waited out its backoff),
and a ``max_concurrency`` raised by a config import did not take effect at all until a restart
(the limit the dispatcher had learned kept the old value).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from fake_worker import FakeWorker

from gpugate.config import GatewayConfig
from harness import RunningGateway, make_config, serving, upstream

TOKEN = "capacity-admin-token"
SECRETS = {"HOME1_SECRET": "secret-of-home-1", "HOME2_SECRET": "secret-of-home-2"}
ENV = {"GPUGATE_ADMIN_TOKEN": TOKEN, **SECRETS}
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
CHAT = {"messages": [{"role": "user", "content": "hello"}]}
BACKOFF_S = 5.0  # the dispatcher's AT_CAPACITY backoff
AT_ONCE_S = 2.0  # "at once", with room for a loaded machine; well under the backoff


def capacity_config(dsn: str, urls: tuple[str, str]) -> GatewayConfig:
    homes = [
        {
            "id": f"home-{n}",
            "kind": "push",
            "models": ["qwen"],
            "push": {"url": url, "secret_env": f"HOME{n}_SECRET", "auth": "bearer"},
            "max_concurrency": limit,
        }
        for n, (url, limit) in enumerate(zip(urls, (2, 1), strict=True), start=1)
    ]
    return make_config(
        dsn,
        [upstream("q0", ["http://127.0.0.1:9"], ["qwen"])],
        admin_token_env="GPUGATE_ADMIN_TOKEN",
        runtimes=[*homes, {"id": "local", "kind": "upstream", "enabled": False}],
        fallback_chain=["home-1", "home-2", "local"],
        default_runtime="home-1",
    )


@contextlib.asynccontextmanager
async def full(
    dsn: str, http: aiohttp.ClientSession
) -> AsyncIterator[tuple[RunningGateway, FakeWorker, FakeWorker]]:
    """The gateway with home-1 and home-2 full (x1, x2 on home-1; x3 on home-2)."""
    async with FakeWorker() as one, FakeWorker() as two:
        async with serving(capacity_config(dsn, (one.url, two.url)), environ=ENV) as gw:
            for slug in ("x1", "x2", "x3"):
                await create(http, gw, slug)
            await until(lambda: (2, 1) == (len(posts(one)), len(posts(two))), "slots full")
            yield gw, one, two


async def create(http: aiohttp.ClientSession, gw: RunningGateway, slug: str) -> None:
    body = {"model": "qwen", "input": CHAT, "slug": slug}
    async with http.post(gw.v1 + "/jobs", json=body) as resp:
        assert 202 == resp.status, await resp.text()


async def deferred_at_capacity(gw: RunningGateway, slug: str) -> None:
    async def deferred() -> bool:
        events = await gw.gateway.store.job_events(slug)
        return any(e.status == "deferred" and e.error_code == "AT_CAPACITY" for e in events)

    await until_async(deferred, f"{slug} deferred AT_CAPACITY")


def posts(worker: FakeWorker) -> list[dict[str, Any]]:
    return [r.body for r in worker.received if r.method == "POST"]


def pushed(worker: FakeWorker, slug: str) -> dict[str, Any]:
    return next(body for body in posts(worker) if body["slug"] == slug)


async def until(condition: Callable[[], bool], what: str, within_s: float = 10.0) -> float:
    """Wait until ``condition()`` holds; how long it took."""

    async def check() -> bool:
        return condition()

    return await until_async(check, what, within_s)


async def until_async(
    condition: Callable[[], Awaitable[bool]], what: str, within_s: float = 10.0
) -> float:
    """Wait until ``condition()`` holds; how long it took."""
    start = time.monotonic()
    try:
        async with asyncio.timeout(within_s):
            while not await condition():
                await asyncio.sleep(0.01)
    except TimeoutError:
        pytest.fail(f"{what} did not happen within {within_s} s")
    return time.monotonic() - start


async def report(
    http: aiohttp.ClientSession, gw: RunningGateway, worker: FakeWorker, slug: str, how: str
) -> None:
    """What the worker holding ``slug`` on home-1 sends: its result, or a failure for good."""
    token = pushed(worker, slug)["lease_token"]
    headers = {"Authorization": f"Bearer {SECRETS['HOME1_SECRET']}", "X-Lease-Token": token}
    if how == "result":
        method, url, body = "PATCH", f"{gw.v1}/jobs/{slug}", {"result": {"ok": True}}
    else:
        method, url = "POST", f"{gw.v1}/jobs/{slug}/fail"
        body = {"error_code": "MODEL_CRASHED", "message": "no", "retryable": False}
    async with http.request(method, url, json=body, headers=headers) as resp:
        assert 200 == resp.status, await resp.text()


@pytest.mark.parametrize("frees", ["cancel", "result", "fail"])
async def test_a_freed_slot_runs_the_waiting_job_at_once_whatever_freed_it(
    sqlite_dsn: str, http: aiohttp.ClientSession, frees: str
) -> None:
    async with full(sqlite_dsn, http) as (gw, one, _):
        await create(http, gw, "x4")
        await deferred_at_capacity(gw, "x4")

        if frees == "cancel":
            async with http.post(gw.v1 + "/jobs/x1/cancel") as resp:
                assert 200 == resp.status, await resp.text()
        else:
            await report(http, gw, one, "x1", frees)
        waited = await until(
            lambda: any(body["slug"] == "x4" for body in posts(one)),
            "x4 submitted to home-1",
            within_s=BACKOFF_S * 2,
        )
        x4 = await gw.gateway.store.get_job("x4")
    assert x4 is not None
    assert "home-1" == x4.runner
    assert waited < AT_ONCE_S, f"x4 waited {waited:.2f} s for the slot {frees} freed"


async def test_a_max_concurrency_raised_by_import_is_the_new_limit_at_once(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """home-2 1 → 3 by ``PUT /admin/config``: the two jobs waiting run there at once, with no
    restart; nothing was learned from a 429, so the new max is the limit."""
    async with full(sqlite_dsn, http) as (gw, _, two):
        for slug in ("x4", "x5"):
            await create(http, gw, slug)
            await deferred_at_capacity(gw, slug)
        async with http.get(gw.url + "/admin/config", headers=ADMIN) as resp:
            document = await resp.json()
        for runtime in document["runtimes"]:
            if runtime["id"] == "home-2":
                runtime["max_concurrency"] = 3
        headers = {**ADMIN, "Content-Type": "application/json"}
        async with http.put(
            gw.url + "/admin/config", data=json.dumps(document), headers=headers
        ) as resp:
            assert 200 == resp.status, await resp.text()

        waited = await until(
            lambda: 3 == len(posts(two)), "x4 and x5 submitted to home-2", within_s=BACKOFF_S * 2
        )
        async with http.get(gw.url + "/admin/runtimes/home-2", headers=ADMIN) as resp:
            detail = await resp.json()
    assert ["x3", "x4", "x5"] == sorted(body["slug"] for body in posts(two))
    assert (3, 3) == (detail["max_concurrency"], detail["in_flight"])
    assert waited < AT_ONCE_S, f"the jobs waited {waited:.2f} s for the slots the import added"
