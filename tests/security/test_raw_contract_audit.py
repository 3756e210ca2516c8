"""``/u/{upstream_id}/{path}`` read back against DESIGN §2a/§3 and docs/security.md (session 15's
acceptance audit): what an unknown upstream answers, that a ``raw:`` block binds every upstream
that has one, and that queries, bodies and streams pass through as sent."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from raw_rig import Rig, recording_upstream, send_raw

from gpugate.fleet import ModelServer
from harness import make_config, serving, upstream


@pytest.fixture
async def rig(sqlite_dsn: str) -> AsyncIterator[Rig]:
    async with recording_upstream() as up:
        narrowed = {"methods": ["GET"], "path_prefixes": ["/v1/models"]}
        config = make_config(
            sqlite_dsn,
            [
                upstream("int", [up.url], ["m-int"]),
                upstream("narrowed", [up.url], ["m-narrowed"], raw=narrowed),
            ],
        )
        async with serving(config) as gw:
            yield Rig(gw, up)


async def test_an_unknown_upstream_is_404_unknown_upstream_in_openais_error_shape(
    rig: Rig,
) -> None:
    answer = await send_raw(rig.gw.url, "GET", "/u/nope/v1/models")
    error = answer.json()["error"]
    assert (404, "UNKNOWN_UPSTREAM") == (answer.status, error["code"])
    assert {"message", "type", "code"} <= set(error)
    assert "nope" in error["message"]
    assert [] == rig.up.seen


async def test_a_raw_block_on_an_internal_keyless_upstream_binds_it_too(rig: Rig) -> None:
    """``raw.methods`` and ``raw.path_prefixes`` are what `/u/` may forward to the upstream
    (docs/configuration.md); an internal upstream that has the block is held to it, where
    before the block was silently ignored and every method and path went through."""
    allowed = await send_raw(rig.gw.url, "GET", "/u/narrowed/v1/models?x=1")
    wrong_method = await send_raw(rig.gw.url, "DELETE", "/u/narrowed/v1/models")
    wrong_prefix = await send_raw(rig.gw.url, "GET", "/u/narrowed/admin/keys")
    assert [200, 403, 403] == [allowed.status, wrong_method.status, wrong_prefix.status]
    assert ["RAW_FORBIDDEN"] * 2 == [wrong_method.error_code(), wrong_prefix.error_code()]
    assert ["/base/v1/models?x=1"] == [s.target for s in rig.up.seen]


async def test_the_query_and_the_body_pass_through_as_sent(rig: Rig) -> None:
    body = b'{"a": [1, 2, 3], "b": "\xc3\xa9"}'
    answer = await send_raw(
        rig.gw.url,
        "PUT",
        "/u/int/v1/things/7?select=a,b&n=%20x",
        headers={"Content-Type": "application/json"},
        body=body,
    )
    assert 200 == answer.status
    [seen] = rig.up.seen
    assert ("PUT", "/base/v1/things/7?select=a,b&n=%20x") == (seen.method, seen.target)
    assert len(body) == seen.body_bytes


async def test_a_stream_through_u_is_relayed_as_it_comes_not_after_it_ends(
    sqlite_dsn: str,
) -> None:
    async with ModelServer(["qwen"], name="q0") as fake:
        fake.update(chunk_delay_s=0.25, chunks=4)
        config = make_config(sqlite_dsn, [upstream("q0", [fake.url], ["qwen"])])
        async with serving(config) as gw, aiohttp.ClientSession() as http:
            body = {"model": "qwen", "stream": True, "messages": [{"role": "user", "content": "x"}]}
            started = time.monotonic()
            arrivals: list[float] = []
            async with http.post(gw.url + "/u/q0/v1/chat/completions", json=body) as resp:
                assert 200 == resp.status
                assert resp.headers["content-type"].startswith("text/event-stream")
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        json.loads(line[6:])
                        arrivals.append(time.monotonic() - started)
            ended = time.monotonic() - started
    assert len(arrivals) >= 4
    assert arrivals[0] < ended - 0.5  # the first event reached the client long before the end


async def test_a_head_request_is_forwarded_without_a_body(rig: Rig) -> None:
    answer = await send_raw(rig.gw.url, "HEAD", "/u/int/v1/models")
    assert 200 == answer.status
    assert [("HEAD", "/base/v1/models")] == [(s.method, s.target) for s in rig.up.seen]
