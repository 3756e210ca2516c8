"""The data plane's answers against the HTTP contract (DESIGN §3): the headers every answer
carries once an upstream was tried, ``Retry-After`` on every 429 and 503, the count of every
request in ``gateway_requests_total`` (with bounded labels), and 405 for a method a route does
not take.

Each test runs against a real gateway in front of a scripted upstream, once on the fast path
and once with ``GPUGATE_FASTPATH=0`` (the ASGI path): a client sees the same on both.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from harness import make_config, serving, upstream
from scripted_upstream import Step, scripted

CHAT = [{"role": "user", "content": "hi"}]
BODY = {"model": "m", "messages": CHAT}
TWO_TRIES = {"attempts": 2, "backoff_s": 0.01, "max_backoff_s": 0.05, "retry_after_max_s": 5}


@pytest.fixture(params=["fast", "asgi"])
def plane(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which server serves the OpenAI routes: the fast path, or ASGI (``GPUGATE_FASTPATH=0``)."""
    monkeypatch.setenv("GPUGATE_FASTPATH", "1" if request.param == "fast" else "0")
    return str(request.param)


async def post(
    http: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any] | bytes = BODY,
    headers: dict[str, str] | None = None,
) -> tuple[int, CIMultiDict[str], bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    async with http.post(url + "/v1/chat/completions", data=data, headers=sent) as resp:
        return resp.status, CIMultiDict(resp.headers), await resp.read()


# --- Retry-After on a relayed 429 or 503 ----------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("status", [429, 503])
async def test_a_relayed_429_or_503_without_retry_after_gets_the_endpoints_backoff_as_one(
    sqlite_dsn: str, http: aiohttp.ClientSession, plane: str, status: int, stream: bool
) -> None:
    """Two load signals in a row back the endpoint off 1 s, then 2 s: the client is told to
    come back when the gateway would send there again, in whole seconds."""
    async with scripted(Step(status=status, error="busy")) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=TWO_TRIES)])
        async with serving(config) as gw:
            got, headers, body = await post(http, gw.url, {**BODY, "stream": stream})
    assert (status, "busy") == (got, json.loads(body)["error"]["message"])
    assert ("2", "2") == (headers.get("Retry-After"), headers["X-Gateway-Attempts"])
    assert 2 == server.count


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_an_upstreams_own_retry_after_on_a_relayed_429_passes_through_unchanged(
    sqlite_dsn: str, http: aiohttp.ClientSession, plane: str, stream: bool
) -> None:
    """Longer than retry_after_max_s (5 s): given up at once, the upstream's value kept."""
    async with scripted(Step(status=429, headers=(("Retry-After", "30"),))) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=TWO_TRIES)])
        async with serving(config) as gw:
            got, headers, _ = await post(http, gw.url, {**BODY, "stream": stream})
    assert (429, ["30"]) == (got, headers.getall("Retry-After"))
