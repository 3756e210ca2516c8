"""Idempotency-Key on the sync path: replay byte-identical, before admission, across restarts."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from multidict import CIMultiDict

from gpugate.fleet import ServerBehaviour
from harness import eventually, make_config, model_servers, serving, upstream

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def post(
    http: aiohttp.ClientSession, url: str, key: str, body: dict[str, object] = BODY
) -> tuple[int, CIMultiDict[str], bytes]:
    headers = {"Idempotency-Key": key}
    async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        return resp.status, resp.headers.copy(), await resp.read()


async def test_a_replay_is_byte_identical_and_never_reaches_the_upstream(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        async with serving(make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])) as gw:
            first = await post(http, gw.url, "key-1")
            again = await post(http, gw.url, "key-1")
    assert 200 == first[0] == again[0]
    assert first[2] == again[2]
    assert "true" == again[1]["Idempotent-Replayed"]
    assert "Idempotent-Replayed" not in first[1]
    assert "u" == again[1]["X-Gateway-Upstream"]
    assert {"key-1": 1} == server.stats.executions


async def test_a_replay_says_its_own_time_in_the_gateway_and_that_no_upstream_was_tried(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """The stored answer's X-Gateway-Upstream and -Model stay; the replay adds what it did
    itself: its overhead, and 0 tries (the stored answer's own count is not this request's)."""
    async with model_servers(("u", ["m"])) as (server,):
        async with serving(make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])) as gw:
            first = await post(http, gw.url, "key-6")
            again = await post(http, gw.url, "key-6")
    assert ("1", "0") == (first[1]["X-Gateway-Attempts"], again[1]["X-Gateway-Attempts"])
    assert float(again[1]["X-Gateway-Overhead-Ms"]) >= 0
    assert ["u"] == again[1].getall("X-Gateway-Upstream")
    assert ["m"] == again[1].getall("X-Gateway-Model")
    assert ["true"] == again[1].getall("Idempotent-Replayed")


async def test_a_replay_survives_a_gateway_restart(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])
        async with serving(config) as gw:
            first = await post(http, gw.url, "key-2")
        async with serving(config) as gw:
            again = await post(http, gw.url, "key-2")
    assert first[2] == again[2]
    assert "true" == again[1]["Idempotent-Replayed"]
    assert {"key-2": 1} == server.stats.executions


async def test_the_same_key_with_a_different_body_is_refused_and_changes_nothing(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        async with serving(make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])) as gw:
            first = await post(http, gw.url, "key-3")
            other = {**BODY, "messages": [{"role": "user", "content": "something else"}]}
            status, _, body = await post(http, gw.url, "key-3", other)
            again = await post(http, gw.url, "key-3")
    assert 422 == status
    assert b"IDEMPOTENCY_KEY_REUSED" in body
    assert first[2] == again[2]
    assert {"key-3": 1} == server.stats.executions


async def test_a_duplicate_while_the_first_is_in_flight_gets_409_at_once(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"]), behaviour=ServerBehaviour(delay_s=0.5)) as (server,):
        async with serving(make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])) as gw:
            first = asyncio.ensure_future(post(http, gw.url, "key-4"))
            await eventually(lambda: server.stats.open_requests == 1, what="first in flight")
            status, headers, body = await post(http, gw.url, "key-4")
            assert 200 == (await first)[0]
    assert 409 == status
    assert b"IDEMPOTENCY_CONFLICT" in body
    assert "Retry-After" in headers


@pytest.mark.parametrize("status", [500, 429])
async def test_a_5xx_or_a_429_from_the_upstream_is_not_kept_so_the_client_may_retry(
    sqlite_dsn: str, http: aiohttp.ClientSession, status: int
) -> None:
    """A 429 (like 408 and 425) says the request was not acted on and to come back: kept, its
    replay would refuse the very retry it asks for until the key expires."""
    once = {"attempts": 1}  # no retries of our own: the client's retry is the subject here
    behaviour = ServerBehaviour(fail_status=status)
    async with model_servers(("u", ["m"]), behaviour=behaviour) as (server,):
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=once)])
        async with serving(config) as gw:
            failed = await post(http, gw.url, "key-5")
            server.update(fail_status=None)
            retried = await post(http, gw.url, "key-5")
    assert (status, 200) == (failed[0], retried[0])
    assert "Idempotent-Replayed" not in retried[1]
    assert {"key-5": 2} == server.stats.received


async def test_raw_pass_through_forwards_the_key_untouched_and_replays_nothing(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """``/u/`` is passed through as is (docs/dataplane.md): the upstream gets the header and
    both requests; what it does with the key is its own affair."""
    async with model_servers(("u", ["m"])) as (server,):
        async with serving(make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])) as gw:
            answers = [await post(http, gw.url + "/u/u", "raw-key") for _ in range(2)]
    assert [200, 200] == [status for status, _, _ in answers]
    assert all("Idempotent-Replayed" not in headers for _, headers, _ in answers)
    assert {"raw-key": 2} == server.stats.executions
