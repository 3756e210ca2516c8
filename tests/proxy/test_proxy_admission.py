"""Admission per upstream: max_inflight, a class-priority queue, queue timeout, a bounded queue."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping

import aiohttp

from gpugate.fleet import ServerBehaviour
from harness import eventually, make_config, model_servers, serving, upstream

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def post(
    http: aiohttp.ClientSession, url: str, *, cls: str | None = None, tag: str = ""
) -> tuple[int, Mapping[str, str], dict[str, object]]:
    headers = {"X-Gpugate-Job": tag} if tag else {}
    if cls is not None:
        headers["X-Request-Class"] = cls
    async with http.post(url + "/v1/chat/completions", json=BODY, headers=headers) as resp:
        return resp.status, resp.headers.copy(), await resp.json()


async def test_queued_requests_are_admitted_system_then_interactive_then_batch(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """max_inflight 2, ten queued requests of mixed class: every interactive one reaches the
    upstream before any batch one (and system before both); FIFO within a class."""
    behaviour = ServerBehaviour(delay_s=0.25)
    async with model_servers(("u", ["m"]), behaviour=behaviour) as (server,):
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], max_inflight=2)])
        async with serving(config) as gw:
            pool = gw.gateway.registry.upstream("u").pool
            blockers = [asyncio.ensure_future(post(http, gw.url, tag=f"blk{i}")) for i in (1, 2)]
            await eventually(lambda: pool.inflight == 2, what="both slots taken")
            order = ["batch", "interactive", "system", "batch", "interactive"]
            order += ["interactive", "batch", "system", "interactive", "batch"]
            counters = {c: itertools.count(1) for c in ("system", "interactive", "batch")}
            queued = []
            for i, cls in enumerate(order, start=1):
                tag = f"{cls}-{next(counters[cls])}"
                queued.append(asyncio.ensure_future(post(http, gw.url, cls=cls, tag=tag)))
                await eventually(lambda i=i: pool.queued == i, what=f"{i} requests queued")
            results = await asyncio.gather(*blockers, *queued)
    assert all(status == 200 for status, _, _ in results)
    arrivals = [key for key in server.stats.received if not key.startswith("blk")]
    classes = [key.split("-")[0] for key in arrivals]
    assert ["system"] * 2 + ["interactive"] * 4 + ["batch"] * 4 == classes
    # two slots free at a time, so within a pair the arrival order may swap
    pairs = [set(arrivals[i : i + 2]) for i in range(0, 10, 2)]
    assert [
        {"system-1", "system-2"},
        {"interactive-1", "interactive-2"},
        {"interactive-3", "interactive-4"},
        {"batch-1", "batch-2"},
        {"batch-3", "batch-4"},
    ] == pairs


async def test_a_request_that_waits_past_queue_timeout_gets_503_queue_timeout_with_retry_after(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    behaviour = ServerBehaviour(delay_s=1.0)
    async with model_servers(("u", ["m"]), behaviour=behaviour) as (server,):
        cfg = upstream("u", [server.url], ["m"], max_inflight=1, queue_timeout_s=0.2)
        async with serving(make_config(sqlite_dsn, [cfg])) as gw:
            pool = gw.gateway.registry.upstream("u").pool
            blocker = asyncio.ensure_future(post(http, gw.url))
            await eventually(lambda: pool.inflight == 1, what="the slot taken")
            status, headers, body = await post(http, gw.url)
            await blocker
    assert 503 == status
    assert "QUEUE_TIMEOUT" == body["error"]["code"]  # type: ignore[index]
    assert int(headers["Retry-After"]) >= 1


async def test_a_full_queue_refuses_at_once(sqlite_dsn: str, http: aiohttp.ClientSession) -> None:
    behaviour = ServerBehaviour(delay_s=0.5)
    async with model_servers(("u", ["m"]), behaviour=behaviour) as (server,):
        cfg = upstream("u", [server.url], ["m"], max_inflight=1, max_queue=1)
        async with serving(make_config(sqlite_dsn, [cfg])) as gw:
            pool = gw.gateway.registry.upstream("u").pool
            first = asyncio.ensure_future(post(http, gw.url))
            await eventually(lambda: pool.inflight == 1, what="the slot taken")
            second = asyncio.ensure_future(post(http, gw.url))
            await eventually(lambda: pool.queued == 1, what="one queued")
            status, headers, body = await post(http, gw.url)
            await asyncio.gather(first, second)
    assert (503, "QUEUE_FULL") == (status, body["error"]["code"])  # type: ignore[index]
    assert "Retry-After" in headers


async def test_an_unknown_request_class_is_a_400_naming_the_valid_ones(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        async with serving(make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])) as gw:
            status, _, body = await post(http, gw.url, cls="urgent")
    assert 400 == status
    error = body["error"]
    assert "BAD_REQUEST" == error["code"]  # type: ignore[index]
    assert "system, interactive, batch" in error["message"]  # type: ignore[index]
    assert 0 == server.stats.requests["/v1/chat/completions"]
