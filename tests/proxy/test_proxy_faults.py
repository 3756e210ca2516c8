"""What the client sees when the fleet misbehaves: each fault of the data-plane issue, one test."""

from __future__ import annotations

import asyncio
import resource
import socket
import sys
import time
from pathlib import Path

import aiohttp
import openai
import pytest

from gpugate.fleet import ServerBehaviour
from gpugate.server import raise_fd_limit
from harness import eventually, make_config, model_servers, serving, upstream

CHAT = [{"role": "user", "content": "hi"}]
BODY = {"model": "m", "messages": CHAT}


def dead_url() -> str:
    """A loopback URL where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_a_refused_connection_is_retried_once_on_the_other_endpoint(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("live", ["m"])) as (live,):
        config = make_config(sqlite_dsn, [upstream("u", [dead_url(), live.url], ["m"])])
        async with serving(config) as gw:
            statuses = []
            for _ in range(10):
                async with http.post(gw.v1 + "/chat/completions", json=BODY) as resp:
                    statuses.append(resp.status)
    assert [200] * 10 == statuses
    assert 10 == live.stats.requests["/v1/chat/completions"]


async def test_a_refused_connection_is_retried_on_another_upstream_serving_the_model(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("live", ["m"])) as (live,):
        upstreams = [upstream("dead", [dead_url()], ["m"]), upstream("live", [live.url], ["m"])]
        async with serving(make_config(sqlite_dsn, upstreams)) as gw:
            served_by = []
            for _ in range(6):
                async with http.post(gw.v1 + "/chat/completions", json=BODY) as resp:
                    assert 200 == resp.status
                    served_by.append(resp.headers["X-Gateway-Upstream"])
    assert ["live"] * 6 == served_by


async def test_a_hanging_upstream_gives_504_within_the_timeout(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"]), behaviour=ServerBehaviour(hang=True)) as (server,):
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], timeout_s=0.5)])
        async with serving(config) as gw:
            started = time.monotonic()
            async with http.post(gw.v1 + "/chat/completions", json=BODY) as resp:
                body = await resp.json()
            elapsed = time.monotonic() - started
            await eventually(lambda: server.stats.open_requests == 0, what="upstream released")
            pool = gw.gateway.registry.upstream("u").pool
            assert 0 == pool.inflight
    assert 504 == resp.status
    assert "UPSTREAM_TIMEOUT" == body["error"]["code"]
    assert 0.5 <= elapsed < 2.0


async def test_an_upstream_reset_mid_stream_ends_the_stream_with_an_error_event(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    behaviour = ServerBehaviour(reset_after_chunks=2, chunk_delay_s=0.01)
    async with model_servers(("u", ["m"]), behaviour=behaviour) as (server,):
        async with serving(make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])) as gw:
            async with http.post(
                gw.v1 + "/chat/completions", json={**BODY, "stream": True}
            ) as resp:
                raw = (await resp.read()).decode()
            client = openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
            stream = await client.chat.completions.create(model="m", messages=CHAT, stream=True)
            with pytest.raises(openai.APIError, match="broke off"):
                async for _ in stream:
                    pass
            await client.close()
    events = [e for e in raw.split("\n\n") if e.strip()]
    assert events[-1].startswith("event: error\ndata: {")
    assert '"code": "UPSTREAM_ERROR"' in events[-1]
    assert "[DONE]" not in raw


async def test_a_client_leaving_mid_stream_closes_the_upstream_and_frees_the_slot(
    sqlite_dsn: str,
) -> None:
    behaviour = ServerBehaviour(chunk_delay_s=0.2, chunks=50)
    async with model_servers(("u", ["m"]), behaviour=behaviour) as (server,):
        async with serving(make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])) as gw:
            pool = gw.gateway.registry.upstream("u").pool
            async with aiohttp.ClientSession() as session:
                resp = await session.post(
                    gw.v1 + "/chat/completions", json={**BODY, "stream": True}
                )
                await resp.content.readline()  # the first event has arrived
                assert 1 == server.stats.open_streams
                assert 1 == pool.inflight
                resp.close()  # the client goes away
                left_at = time.monotonic()
            await eventually(
                lambda: server.stats.open_streams == 0, within_s=1.0, what="upstream closed"
            )
            closed_after = time.monotonic() - left_at
            await eventually(lambda: pool.inflight == 0, within_s=1.0, what="slot freed")
    assert 1 == server.stats.disconnects
    assert closed_after < 1.0


async def test_a_model_whose_every_endpoint_is_down_answers_503_fast(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    config = make_config(sqlite_dsn, [upstream("u", [dead_url(), dead_url()], ["m"])])
    async with serving(config, probe_interval_s=0.05) as gw:
        endpoints = gw.gateway.registry.upstream("u").endpoints
        await eventually(lambda: all(ep.down for ep in endpoints), what="both probed down")
        async with http.post(gw.v1 + "/chat/completions", json=BODY) as resp:
            body = await resp.json()
        exposition = gw.gateway.metrics.render().decode()
    assert 503 == resp.status
    assert "NO_HEALTHY_UPSTREAM" == body["error"]["code"]
    assert "Retry-After" in resp.headers
    # fast because nothing was tried: no attempt on a known-dead endpoint (no connect, no wait)
    attempts = [
        line for line in exposition.splitlines()
        if line.startswith("gateway_upstream_attempts_total{") and 'upstream="u"' in line
    ]  # fmt: skip
    assert [] == attempts


async def test_an_unknown_model_is_404_and_bad_bodies_are_400(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        async with serving(make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])) as gw:
            url = gw.v1 + "/chat/completions"
            async with http.post(url, json={**BODY, "model": "nope"}) as unknown:
                unknown_body = await unknown.json()
            async with http.post(url, data=b"{not json") as garbled:
                garbled_body = await garbled.json()
            async with http.post(url, json={"messages": CHAT}) as no_model:
                no_model_body = await no_model.json()
    assert (404, "UNKNOWN_MODEL") == (unknown.status, unknown_body["error"]["code"])
    # the 404 says which models exist, so a typo is fixed without reading the config
    assert "the models served: m" in unknown_body["error"]["message"]
    assert (400, "BAD_REQUEST") == (garbled.status, garbled_body["error"]["code"])
    assert (400, "BAD_REQUEST") == (no_model.status, no_model_body["error"]["code"])


async def test_a_body_over_max_body_bytes_is_413(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = make_config(
            sqlite_dsn, [upstream("u", [server.url], ["m"])], server={"max_body_bytes": 1000}
        )
        async with serving(config) as gw:
            big = {**BODY, "messages": [{"role": "user", "content": "x" * 2000}]}
            async with http.post(gw.v1 + "/chat/completions", json=big) as resp:
                body = await resp.json()
    assert (413, "PAYLOAD_TOO_LARGE") == (resp.status, body["error"]["code"])
    assert 0 == server.stats.requests["/v1/chat/completions"]


async def test_the_upstreams_own_errors_pass_through_unchanged(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"]), behaviour=ServerBehaviour(fail_status=429)) as (server,):
        async with serving(make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])) as gw:
            async with http.post(gw.v1 + "/chat/completions", json=BODY) as via_gateway:
                through = await via_gateway.read()
            async with http.post(server.url + "/v1/chat/completions", json=BODY) as direct:
                straight = await direct.read()
    assert 429 == via_gateway.status == direct.status
    assert straight == through


async def test_raw_pass_through_forwards_method_path_query_and_body(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        async with serving(make_config(sqlite_dsn, [upstream("tei", [server.url], ["m"])])) as gw:
            async with http.get(gw.url + "/u/tei/v1/models?x=1") as models:
                listed = await models.json()
            async with http.post(
                gw.url + "/u/tei/v1/embeddings", json={"model": "m", "input": "a"}
            ) as emb:
                embedded = await emb.json()
            async with http.get(gw.url + "/u/nope/health") as unknown:
                unknown_body = await unknown.json()
    assert ["m"] == [m["id"] for m in listed["data"]]
    assert "tei" == emb.headers["X-Gateway-Upstream"]
    assert 1 == len(embedded["data"])
    assert (404, "UNKNOWN_UPSTREAM") == (unknown.status, unknown_body["error"]["code"])


async def test_five_5xx_in_a_row_eject_an_endpoint_and_each_is_rescued_by_the_other(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """The failing endpoint answers fastest, so the picker keeps choosing it until passive health
    ejects it: exactly five requests reach it, each retried at once on the healthy endpoint (a
    fresh endpoint needs no backoff), then none while it cools down."""
    slower = ServerBehaviour(delay_s=0.02)
    async with (
        model_servers(("bad", ["m"]), behaviour=ServerBehaviour(fail_status=500)) as (bad,),
        model_servers(("good", ["m"]), behaviour=slower) as (good,),
    ):
        config = make_config(sqlite_dsn, [upstream("u", [bad.url, good.url], ["m"])])
        async with serving(config) as gw:
            statuses, attempts = [], []
            for _ in range(30):
                async with http.post(gw.v1 + "/chat/completions", json=BODY) as resp:
                    statuses.append(resp.status)
                    attempts.append(int(resp.headers["X-Gateway-Attempts"]))
            endpoint = gw.gateway.registry.upstream("u").endpoints[0]
            assert endpoint.ejected_until is not None
    assert 5 == bad.stats.requests["/v1/chat/completions"]  # one failure never ejects; five do
    assert [200] * 30 == statuses
    assert 5 == attempts.count(2)
    assert 25 == attempts.count(1)
    assert 30 == good.stats.requests["/v1/chat/completions"]


async def test_a_connection_that_died_before_any_response_byte_is_retried_on_the_other_endpoint(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """The connection drops after the request was sent, before any byte of answer: nothing
    reached the client, so the request is tried again on the other endpoint (issue #13)."""
    behaviour = ServerBehaviour(drop_connection=True)
    async with (
        model_servers(("dropper", ["m"]), behaviour=behaviour) as (dropper,),
        model_servers(("good", ["m"])) as (good,),
    ):
        config = make_config(sqlite_dsn, [upstream("u", [dropper.url, good.url], ["m"])])
        async with serving(config) as gw:
            outcomes = []
            for _ in range(50):  # until one request lands on the dropper
                async with http.post(gw.v1 + "/chat/completions", json=BODY) as resp:
                    outcomes.append((resp.status, resp.headers["X-Gateway-Attempts"]))
                if dropper.stats.requests["/v1/chat/completions"]:
                    break
    assert (200, "2") == outcomes[-1]
    assert len(outcomes) == good.stats.requests["/v1/chat/completions"]


_CLOSING_UPSTREAM = """
import sys
from aiohttp import web

async def chat(request):
    await request.read()
    body = {"id": "c", "object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}
    return web.json_response(body, headers={"Connection": "close"})

async def health(request):
    return web.json_response({"ok": True}, headers={"Connection": "close"})

app = web.Application()
app.router.add_post("/v1/chat/completions", chat)
app.router.add_get("/health", health)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


async def test_running_out_of_file_descriptors_is_the_gateways_own_503_never_the_upstreams(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """#14.5: EMFILE on connect answers 503 GATEWAY_OVERLOADED with Retry-After, is counted,
    and the healthy upstream is neither blamed nor ejected (it serves once fds are back).

    The upstream is another process (its descriptors are its own) that closes every
    connection, so each request needs a new socket of the gateway — and there is none."""
    port = int(dead_url().rsplit(":", 1)[1])
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", _CLOSING_UPSTREAM, str(port))
    try:
        url = f"http://127.0.0.1:{port}"
        await eventually_listening(port)
        config = make_config(sqlite_dsn, [upstream("u", [url], ["m"])])
        async with serving(config) as gw:
            # the gateway's descriptors are this process's: in process only (skipped with
            # GPUGATE_TEST_WORKERS, where they are another process's and the limit misses them)
            endpoint = gw.gateway.registry.upstream("u").endpoints[0]
            async with http.get(gw.url + "/healthz") as warm:  # the client's connection, kept
                await warm.read()
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            statuses, codes = [], []
            hogs: list[socket.socket] = []
            try:
                in_use = len(list(Path("/proc/self/fd").iterdir()))
                resource.setrlimit(resource.RLIMIT_NOFILE, (in_use, hard))
                for _ in range(64):  # take whatever descriptors are still free (bounded)
                    try:
                        hogs.append(socket.socket())
                    except OSError:
                        break
                for _ in range(6):
                    async with http.post(gw.v1 + "/chat/completions", json=BODY) as resp:
                        statuses.append((resp.status, resp.headers.get("Retry-After")))
                        codes.append((await resp.json())["error"]["code"])
            finally:
                for hog in hogs:
                    hog.close()
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            async with http.post(gw.v1 + "/chat/completions", json=BODY) as after:
                assert 200 == after.status
            metrics = await (await http.get(gw.url + "/metrics")).text()
    finally:
        child.terminate()
        await child.wait()
    assert [(503, "1")] * 6 == statuses
    assert ["GATEWAY_OVERLOADED"] * 6 == codes
    assert (None, 0) == (endpoint.ejected_until, endpoint.failure_streak)
    assert 'gateway_overloaded_total{reason="file_descriptors"} 6.0' in metrics


async def eventually_listening(port: int, within_s: float = 10.0) -> None:
    """Wait (bounded) until something accepts connections on ``port``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if loop.time() > deadline:
                pytest.fail(f"nothing listens on {port} within {within_s} s")
            await asyncio.sleep(0.05)
            continue
        writer.close()
        await writer.wait_closed()
        return


def test_the_soft_open_file_limit_is_raised_to_the_hard_limit_at_start() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(soft, 512)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        now_soft, now_hard = raise_fd_limit()
        assert (now_soft, now_hard) == resource.getrlimit(resource.RLIMIT_NOFILE)
        assert now_hard == hard
        assert hard in (now_soft, resource.RLIM_INFINITY)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
