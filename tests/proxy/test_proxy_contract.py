"""The data plane's answers against the HTTP contract (DESIGN §3): the headers every answer
carries once an upstream was tried, ``Retry-After`` on every 429 and 503, the count of every
request in ``gateway_requests_total`` (with bounded labels), and 405 for a method a route does
not take.

Each test runs against a real gateway in front of a scripted upstream, once on the fast path
and once with ``GPUGATE_FASTPATH=0`` (the ASGI path): a client sees the same on both.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from yarl import URL

from harness import RunningGateway, make_config, serving, upstream
from scripted_upstream import OK, Scripted, Step, scripted

CHAT = [{"role": "user", "content": "hi"}]
BODY = {"model": "m", "messages": CHAT}
TWO_TRIES = {"attempts": 2, "backoff_s": 0.01, "max_backoff_s": 0.05, "retry_after_max_s": 5}
THREE_TRIES = {**TWO_TRIES, "attempts": 3}


@pytest.fixture(params=["fast", "asgi"])
def plane(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which server serves the OpenAI routes: the fast path, or ASGI (``GPUGATE_FASTPATH=0``)."""
    monkeypatch.setenv("GPUGATE_FASTPATH", "1" if request.param == "fast" else "0")
    return str(request.param)


def dead_url() -> str:
    """A loopback URL where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


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


@contextlib.asynccontextmanager
async def answering(
    sqlite_dsn: str, **extra: Any
) -> AsyncIterator[tuple[RunningGateway, Scripted]]:
    """A gateway in front of one upstream ``u`` serving ``m`` that answers every request."""
    async with scripted(OK) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])], **extra)
        async with serving(config) as gw:
            yield gw, server


async def metrics(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url + "/metrics") as resp:
        return await resp.text()


def requests_total(text: str, **labels: str) -> float:
    """``gateway_requests_total`` with exactly these labels (0 when the series is absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("gateway_requests_total{" + want + "} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


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


# --- the gateway's headers and the metric's upstream once an upstream was tried -------------


def timing_out(url: str) -> dict[str, Any]:
    deadlines = {"first_byte_timeout_s": 0.3, "first_token_timeout_s": 0.3}
    return upstream("slow", [url], ["m"], retry=THREE_TRIES, **deadlines)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_504_after_a_timeout_names_the_upstream_tried_its_tries_and_the_overhead(
    sqlite_dsn: str, http: aiohttp.ClientSession, plane: str, stream: bool
) -> None:
    """A timed-out try is retried only on an endpoint not tried yet: one try. The upstream's
    0.3 s is not the gateway's overhead."""
    async with scripted(Step(hang_s=5)) as server:
        async with serving(make_config(sqlite_dsn, [timing_out(server.url)])) as gw:
            status, headers, body = await post(http, gw.url, {**BODY, "stream": stream})
            text = await metrics(http, gw.url)
    assert (504, "UPSTREAM_TIMEOUT") == (status, json.loads(body)["error"]["code"])
    assert ("slow", "1") == (headers["X-Gateway-Upstream"], headers["X-Gateway-Attempts"])
    assert 0 <= float(headers["X-Gateway-Overhead-Ms"]) < 250
    labels = {"class": "interactive", "code": "UPSTREAM_TIMEOUT", "model": "m"}
    assert 1 == requests_total(text, **labels, upstream="slow")
    assert 0 == requests_total(text, **labels, upstream="")


async def test_a_502_after_refused_connects_names_the_upstream_tried_and_its_tries(
    sqlite_dsn: str, http: aiohttp.ClientSession, plane: str
) -> None:
    config = make_config(sqlite_dsn, [upstream("down", [dead_url()], ["m"], retry=THREE_TRIES)])
    async with serving(config) as gw:
        status, headers, body = await post(http, gw.url)
        text = await metrics(http, gw.url)
    assert (502, "UPSTREAM_UNREACHABLE") == (status, json.loads(body)["error"]["code"])
    assert ("down", "3") == (headers["X-Gateway-Upstream"], headers["X-Gateway-Attempts"])
    assert float(headers["X-Gateway-Overhead-Ms"]) >= 0
    labels = {"class": "interactive", "code": "UPSTREAM_UNREACHABLE", "model": "m"}
    assert 1 == requests_total(text, **labels, upstream="down")


async def test_a_stream_that_opens_with_an_error_every_time_is_a_502_naming_the_upstream(
    sqlite_dsn: str, http: aiohttp.ClientSession, plane: str
) -> None:
    async with scripted(Step(first_event_error=True)) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=THREE_TRIES)])
        async with serving(config) as gw:
            status, headers, body = await post(http, gw.url, {**BODY, "stream": True})
            text = await metrics(http, gw.url)
    assert (502, "UPSTREAM_ERROR") == (status, json.loads(body)["error"]["code"])
    assert ("u", "3") == (headers["X-Gateway-Upstream"], headers["X-Gateway-Attempts"])
    assert "X-Gateway-Overhead-Ms" in headers
    labels = {"class": "interactive", "code": "UPSTREAM_ERROR", "model": "m", "upstream": "u"}
    assert 1 == requests_total(text, **labels)


async def test_a_relayed_upstream_error_names_the_upstream_its_tries_and_the_overhead(
    sqlite_dsn: str, http: aiohttp.ClientSession, plane: str
) -> None:
    async with scripted(Step(status=500, error="broken")) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=TWO_TRIES)])
        async with serving(config) as gw:
            status, headers, _ = await post(http, gw.url)
            text = await metrics(http, gw.url)
    assert (500, "u", "2") == (
        status,
        headers["X-Gateway-Upstream"],
        headers["X-Gateway-Attempts"],
    )
    assert float(headers["X-Gateway-Overhead-Ms"]) >= 0
    assert "Retry-After" not in headers  # only a 429 or a 503 says when to come back
    labels = {"class": "interactive", "code": "500", "model": "m", "upstream": "u"}
    assert 1 == requests_total(text, **labels)


# --- every request refused before routing is counted, with bounded labels -------------------


async def test_requests_refused_before_routing_are_counted_with_empty_model_and_upstream(
    sqlite_dsn: str, http: aiohttp.ClientSession, plane: str
) -> None:
    """Bad JSON, no model, an unknown class, a body over the limit: counted by their code, the
    class the one given when it is valid (else the default), never a client's string."""
    async with answering(sqlite_dsn, server={"max_body_bytes": 1000}) as (gw, server):
        answers = [
            await post(http, gw.url, b"{not json"),
            await post(http, gw.url, b'{"model": "m", ', {"X-Request-Class": "batch"}),
            await post(http, gw.url, {"messages": CHAT}),
            await post(http, gw.url, BODY, {"X-Request-Class": "vip-" + "x" * 80}),
            await post(http, gw.url, {**BODY, "pad": "x" * 2000}, {"X-Request-Class": "system"}),
        ]
        text = await metrics(http, gw.url)
    assert [400, 400, 400, 400, 413] == [status for status, _, _ in answers]
    assert 0 == server.count
    empty = {"model": "", "upstream": ""}
    assert 3 == requests_total(text, **{"class": "interactive", "code": "BAD_REQUEST"}, **empty)
    assert 1 == requests_total(text, **{"class": "batch", "code": "BAD_REQUEST"}, **empty)
    assert 1 == requests_total(text, **{"class": "system", "code": "PAYLOAD_TOO_LARGE"}, **empty)
    assert "vip-" not in text


async def test_a_model_the_fleet_does_not_serve_is_counted_under_one_bounded_label(
    sqlite_dsn: str, http: aiohttp.ClientSession, plane: str
) -> None:
    async with answering(sqlite_dsn) as (gw, _):
        for n in range(3):
            status, _, _ = await post(http, gw.url, {**BODY, "model": f"typo-{n}"})
            assert 404 == status
        text = await metrics(http, gw.url)
    labels = {"class": "interactive", "code": "UNKNOWN_MODEL", "upstream": ""}
    assert 3 == requests_total(text, **labels, model="_unknown")
    assert "typo-" not in text


async def test_raw_requests_refused_before_routing_are_counted_without_the_clients_strings(
    sqlite_dsn: str, http: aiohttp.ClientSession, plane: str
) -> None:
    """``/u/`` (always ASGI): an encoded slash, an unknown upstream, an unknown class."""
    async with answering(sqlite_dsn) as (gw, _):
        statuses = []
        for path, headers in [
            ("/u/u/a%2Fb", {}),
            ("/u/nope-upstream/health", {}),
            ("/u/u/health", {"X-Request-Class": "vip"}),
        ]:
            url = URL(gw.url + path, encoded=True)
            async with http.get(url, headers=headers) as resp:
                statuses.append(resp.status)
        text = await metrics(http, gw.url)
    assert [400, 404, 400] == statuses
    empty = {"class": "interactive", "model": "", "upstream": ""}
    assert 2 == requests_total(text, code="BAD_REQUEST", **empty)
    assert 1 == requests_total(text, code="UNKNOWN_UPSTREAM", **empty)
    assert "nope-upstream" not in text


# --- a method an OpenAI route does not take ---------------------------------------------------


ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


async def test_a_method_an_openai_route_does_not_take_is_405_with_allow_post(
    sqlite_dsn: str, http: aiohttp.ClientSession, plane: str
) -> None:
    asked = [(path, "GET") for path in ROUTES] + [(ROUTES[0], m) for m in ("PUT", "DELETE")]
    async with answering(sqlite_dsn) as (gw, server):
        answers = []
        for path, method in asked:
            sent = {"X-Request-Id": f"r-{method}"}
            async with http.request(method, gw.url + path, headers=sent) as resp:
                answers.append((resp.status, resp.headers.copy(), await resp.json()))
        async with http.head(gw.url + ROUTES[0]) as head:
            head_answer = (head.status, head.headers.get("Allow"))
        text = await metrics(http, gw.url)
    for (_, method), (status, headers, body) in zip(asked, answers, strict=True):
        assert (405, "METHOD_NOT_ALLOWED") == (status, body["error"]["code"])
        assert ("POST", f"r-{method}") == (headers["Allow"], headers["X-Request-Id"])
        assert headers["Content-Type"].startswith("application/json")
    assert (405, "POST") == head_answer
    assert 0 == server.count
    labels = {"class": "interactive", "code": "METHOD_NOT_ALLOWED", "model": "", "upstream": ""}
    assert len(asked) + 1 == requests_total(text, **labels)


# --- ANY /u/{upstream_id}/{path} ------------------------------------------------------------


async def test_head_and_options_on_raw_pass_through_are_forwarded_and_relayed(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """Whatever the upstream answers them (aiohttp: HEAD like GET, OPTIONS not taken)."""
    async with answering(sqlite_dsn) as (gw, _):
        async with http.head(gw.url + "/u/u/health") as head:
            head_answer = (head.status, head.headers["X-Gateway-Upstream"], await head.read())
        async with http.options(gw.url + "/u/u/health") as options:
            options_answer = (options.status, options.headers["X-Gateway-Upstream"])
    assert (200, "u", b"") == head_answer
    assert (405, "u") == options_answer
