"""A replica leaving on purpose (SIGTERM) costs nothing (issue #20), and one still busy when its
grace runs out answers instead of cutting (issue #14, defect 10).

Each test runs the real ``gpugate serve`` as a subprocess in front of fake model servers living
in the test process, and talks to it over HTTP (the ``openai`` client for streams).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import openai
import pytest
from jobs_e2e import GatewayProcess

from gpugate.fleet import ModelServer, ServerBehaviour
from harness import eventually
from ports import free_port

pytestmark = pytest.mark.e2e

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def gateway(
    tmp_path: Path, upstream_url: str, *, server: str, upstream: str = ""
) -> GatewayProcess:
    """A ``gpugate serve`` on SQLite in front of one upstream serving ``m``."""
    port = free_port()
    config = tmp_path / "gw.yaml"
    config.write_text(
        f"""\
listen: 127.0.0.1:{port}
store: sqlite:///{tmp_path / "gw.db"}
upstreams:
  - id: u
    url: {upstream_url}
    models: [m]
{upstream}
server:
{server}
"""
    )
    return GatewayProcess(config, port, tmp_path / "gw.log")


async def readiness(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, object]]:
    async with http.get(url + "/readyz") as resp:
        return resp.status, await resp.json()


async def refuses_connections(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url + "/healthz"):
            return False
    except aiohttp.ClientConnectionError:
        return True


async def poll(probe: Callable[[], Awaitable[bool]], *, within_s: float, what: str) -> None:
    """Await ``probe()`` until it answers True (bounded)."""
    deadline = time.monotonic() + within_s
    while not await probe():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not hold within {within_s} s")
        await asyncio.sleep(0.02)


async def test_sigterm_turns_readyz_503_first_serves_through_the_drain_delay_then_exits_0(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with ModelServer(["m"], name="u") as upstream:
        gw = gateway(tmp_path, upstream.url, server="  drain_delay_s: 2\n  shutdown_grace_s: 5")
        await gw.start(http)
        signalled_at = time.monotonic()
        gw.terminate()

        await poll(lambda: _is_draining(http, gw.url), within_s=1.5, what="/readyz 503 (draining)")
        async with http.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
            served_while_draining = resp.status  # accepted after /readyz said 503
        await poll(lambda: refuses_connections(http, gw.url), within_s=6, what="stopped")
        stopped_after_s = time.monotonic() - signalled_at
        code = await gw.wait(within_s=5)

    assert 200 == served_while_draining
    assert stopped_after_s >= 2  # it kept accepting for the whole delay
    assert 0 == code


async def _is_draining(http: aiohttp.ClientSession, url: str) -> bool:
    status, body = await readiness(http, url)
    checks = {c["name"]: c for c in body["checks"]}  # type: ignore[attr-defined]
    return status == 503 and "draining" in checks["lifecycle"]["detail"]


async def test_a_stream_in_flight_at_sigterm_is_finished_whole_within_the_grace(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    behaviour = ServerBehaviour(chunk_delay_s=0.2, chunks=10)  # about 2 s of stream
    async with ModelServer(["m"], name="u", behaviour=behaviour) as upstream:
        gw = gateway(tmp_path, upstream.url, server="  drain_delay_s: 0.5\n  shutdown_grace_s: 10")
        await gw.start(http)
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0)
        stream = await client.chat.completions.create(**CHAT, stream=True)  # type: ignore[call-overload]
        gw.terminate()
        pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
        code = await gw.wait(within_s=10)
        await client.close()

    assert 10 == len([p for p in pieces if p])
    assert 0 == code


# -- issue #14, defect 10: shutdown past the grace period -------------------------------------


async def test_shutdown_past_the_grace_answers_held_and_queued_requests_503_json_with_retry_after(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """One request holds the only slot of a hung upstream, one waits in its queue; neither can
    finish within a 1 s grace: both get our JSON refusal, not uvicorn's text/plain 500."""
    async with ModelServer(["m"], name="u", behaviour=ServerBehaviour(hang=True)) as upstream:
        gw = gateway(
            tmp_path,
            upstream.url,
            server="  shutdown_grace_s: 1",
            upstream="    max_inflight: 1\n    queue_timeout_s: 60",
        )
        await gw.start(http)
        held = asyncio.ensure_future(http.post(gw.url + "/v1/chat/completions", json=CHAT))
        await eventually(lambda: upstream.stats.open_requests == 1, what="the slot taken")
        queued = asyncio.ensure_future(http.post(gw.url + "/v1/chat/completions", json=CHAT))
        await poll(lambda: _queued(http, gw.url), within_s=5, what="the second request queued")
        gw.terminate()
        answers = []
        for request in (held, queued):
            async with await request as resp:
                body = await resp.read()
                answers.append(
                    (resp.status, resp.content_type, "retry-after" in resp.headers, body)
                )
        code = await gw.wait(within_s=10)

    for status, content_type, retry_after, body in answers:
        assert (503, "application/json", True) == (status, content_type, retry_after)
        assert "SHUTTING_DOWN" == json.loads(body)["error"]["code"]
    assert 0 == code


async def test_shutdown_past_the_grace_ends_an_sse_stream_with_event_error(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """The stream ends the way the data plane ends one its upstream broke off, so the
    ``openai`` client raises ``APIError`` (with our code) instead of seeing a truncation."""
    behaviour = ServerBehaviour(chunk_delay_s=0.5, chunks=100)  # 50 s: longer than the grace
    async with ModelServer(["m"], name="u", behaviour=behaviour) as upstream:
        gw = gateway(tmp_path, upstream.url, server="  shutdown_grace_s: 1")
        await gw.start(http)
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0)
        stream = await client.chat.completions.create(**CHAT, stream=True)  # type: ignore[call-overload]
        pieces: list[object] = []
        with pytest.raises(openai.APIError) as raised:
            await _read_all(stream, pieces, on_first=gw.terminate)
        code = await gw.wait(within_s=10)
        await client.close()

    assert 1 < len(pieces) < 100  # it streamed through the grace, then ended early
    assert "SHUTTING_DOWN" == raised.value.body["code"]  # type: ignore[index]
    assert 0 == code


async def _read_all(
    stream: AsyncIterator[object], into: list[object], on_first: Callable[[], None]
) -> None:
    async for chunk in stream:
        into.append(chunk)
        if len(into) == 1:
            on_first()


async def _queued(http: aiohttp.ClientSession, url: str) -> bool:
    """Whether a request waits in upstream ``u``'s admission queue (``/metrics``)."""
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    return 'gateway_queue_depth{class="interactive",upstream="u"} 1.0' in text
