"""The data plane's resilience and idempotency contract (DESIGN §2a, §3; docs/dataplane.md),
read back through a running gateway the way an acceptance check would: the real ``openai``
client (which never retries here) or plain HTTP, real loopback upstreams that fail as real
providers do, and what the upstreams saw as the evidence.

Each test pins a place where the gateway once did something other than the contract says
(session 15's audit), or a part of the contract no other test pinned.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import aiohttp
import openai
import pytest
from multidict import CIMultiDict

from harness import make_config, serving, upstream
from identity.keyed import ENVIRON, bearer, create_key, keyed_config
from proxy.test_proxy_contract import dead_url
from scripted_upstream import OK, WORDS, Step, answer_text, scripted
from workers.processes import serve_process

pytestmark = pytest.mark.timeout(120)

CHAT = [{"role": "user", "content": "hi"}]
BODY = {"model": "m", "messages": CHAT}
QUICK = {"attempts": 3, "backoff_s": 0.05, "max_backoff_s": 0.1, "retry_after_max_s": 5}


async def post(
    http: aiohttp.ClientSession,
    v1: str,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, CIMultiDict[str], bytes]:
    async with http.post(v1 + "/chat/completions", json=body or BODY, headers=headers) as resp:
        return resp.status, CIMultiDict(resp.headers), await resp.read()


def gaps(seen: list[Any]) -> list[float]:
    """The seconds between the tries an upstream saw."""
    return [b.at - a.at for a, b in itertools.pairwise(seen)]


# --- retries: the waits are the retry policy's ---------------------------------------------


@pytest.mark.parametrize("status", [429, 503])
async def test_a_load_signal_without_retry_after_is_retried_within_max_backoff_s(
    sqlite_dsn: str, status: int
) -> None:
    """`retry.max_backoff_s` caps the wait before a retry (docs/configuration.md: "the largest
    backoff ceiling"; dataplane.md: "else full-jitter exponential backoff ... capped at
    max_backoff_s"). A 429/503 that asked for nothing used to be retried after the gateway's
    own load backoff of the endpoint instead — 1 s, then 2 s — ten and twenty times the cap."""
    async with scripted(Step(status=status), Step(status=status), OK) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=QUICK)])
        async with (
            serving(config) as gw,
            openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0) as client,
        ):
            raw = await client.chat.completions.with_raw_response.create(
                model="m",
                messages=CHAT,  # type: ignore[arg-type]
            )
    assert answer_text(WORDS) == raw.parse().choices[0].message.content
    assert "3" == raw.headers["x-gateway-attempts"]
    assert 3 == server.count
    assert all(gap < 0.1 + 0.4 for gap in gaps(server.seen)), gaps(server.seen)


async def test_a_retry_after_the_endpoint_sent_is_still_waited_for(sqlite_dsn: str) -> None:
    """The other half of the rule: the endpoint's own `Retry-After` (within
    `retry_after_max_s`) is what a retry there waits, not the short backoff."""
    async with scripted(Step(status=503, headers=(("Retry-After", "1"),)), OK) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=QUICK)])
        async with serving(config) as gw, aiohttp.ClientSession() as http:
            status, headers, _ = await post(http, gw.v1)
    assert (200, "2") == (status, headers["X-Gateway-Attempts"])
    assert gaps(server.seen)[0] >= 0.95


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_an_endpoint_that_timed_out_is_not_tried_again_after_an_earlier_answer(
    sqlite_dsn: str, stream: bool
) -> None:
    """dataplane.md §2: a missed deadline is retried "on an endpoint *not tried yet* only", so
    a silent provider holds a client one deadline per endpoint. A 503 first, then silence on
    the one endpoint: the gateway used to wait out a second deadline there (3 tries); it gives
    up after the timeout and relays the 503 it kept (2 tries)."""
    silent = Step(hang_s=5.0)
    async with scripted(Step(status=503, error="busy"), silent, silent) as server:
        deadlines = {"first_byte_timeout_s": 0.5, "first_token_timeout_s": 0.5}
        entry = upstream("u", [server.url], ["m"], retry=QUICK, **deadlines)
        async with serving(make_config(sqlite_dsn, [entry])) as gw, aiohttp.ClientSession() as http:
            started = time.monotonic()
            status, headers, body = await post(http, gw.v1, {**BODY, "stream": stream})
            elapsed = time.monotonic() - started
    assert (503, "busy") == (status, json.loads(body)["error"]["message"])
    assert "2" == headers["X-Gateway-Attempts"]
    assert 2 == server.count
    assert elapsed < 0.5 + 0.9  # one deadline, not two


async def test_a_refused_connect_is_retried_once_on_another_endpoint_even_with_one_attempt(
    sqlite_dsn: str,
) -> None:
    """DESIGN §3 [contract]: "A request refused at connect is retried once on another
    endpoint." With `retry: {attempts: 1}` the gateway used to give the client a 502 whenever
    it picked the refusing endpoint first; the upstream never saw that request, so the one
    try owed is made on the other endpoint."""
    async with scripted(OK) as server:
        entry = upstream("u", [dead_url(), server.url], ["m"], retry={"attempts": 1})
        async with serving(make_config(sqlite_dsn, [entry])) as gw, aiohttp.ClientSession() as http:
            replies = [await post(http, gw.v1) for _ in range(12)]
            async with http.get(gw.url + "/metrics") as resp:
                metrics = await resp.text()
    refused = 'gateway_upstream_attempts_total{outcome="connect_error",upstream="u"}'
    assert refused in metrics  # the refusing endpoint was picked first at least once
    assert [200] * 12 == [status for status, _, _ in replies]
    assert {"1", "2"} >= {headers["X-Gateway-Attempts"] for _, headers, _ in replies}
    assert 12 == server.count


async def test_x_gateway_attempts_is_the_exact_count_past_fifteen(sqlite_dsn: str) -> None:
    """`X-Gateway-Attempts` is the tries made (DESIGN §3): 10 on the primary (5 on each of its
    endpoints, each then ejected by passive health), 5 on the first fallback, 1 on the second
    are 16, not "16+"."""
    no_wait = {"attempts": 10, "backoff_s": 0, "max_backoff_s": 0, "retry_after_max_s": 5}
    failing = Step(status=500, error="down")
    async with (
        scripted(failing, name="pa") as pa,
        scripted(failing, name="pb") as pb,
        scripted(failing, name="f1") as f1,
        scripted(OK, name="f2") as f2,
    ):
        upstreams = [
            upstream("p", [pa.url, pb.url], ["m"], retry=no_wait),
            upstream("f1", [f1.url], ["fb1"], retry=no_wait),
            upstream("f2", [f2.url], ["fb2"], retry=no_wait),
        ]
        models = [{"name": "m", "fallbacks": ["fb1", "fb2"]}]
        config = make_config(sqlite_dsn, upstreams, models=models)
        async with serving(config) as gw, aiohttp.ClientSession() as http:
            status, headers, _ = await post(http, gw.v1)
    assert (200, "fb2") == (status, headers["X-Gateway-Model"])
    assert (5, 5, 5, 1) == (pa.count, pb.count, f1.count, f2.count)
    assert "16" == headers["X-Gateway-Attempts"]


# --- fallbacks -----------------------------------------------------------------------------


async def test_a_retry_after_over_retry_after_max_s_walks_on_to_the_fallback_at_once(
    sqlite_dsn: str,
) -> None:
    """dataplane.md §2: a `Retry-After` longer than `retry_after_max_s` gives the model up at
    once — with a fallback, the fallback answers without waiting, and names itself."""
    async with (
        scripted(Step(status=429, headers=(("Retry-After", "30"),)), name="p") as primary,
        scripted(OK, name="f") as fallback,
    ):
        upstreams = [
            upstream("p", [primary.url], ["m"], retry=QUICK),
            upstream("f", [fallback.url], ["fb"], retry=QUICK),
        ]
        config = make_config(sqlite_dsn, upstreams, models=[{"name": "m", "fallbacks": ["fb"]}])
        async with (
            serving(config) as gw,
            openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0) as client,
        ):
            started = time.monotonic()
            raw = await client.chat.completions.with_raw_response.create(
                model="m",
                messages=CHAT,  # type: ignore[arg-type]
            )
            elapsed = time.monotonic() - started
    assert ("fb", "2") == (raw.headers["x-gateway-model"], raw.headers["x-gateway-attempts"])
    assert "fb" == raw.parse().model  # the fallback's own answer, relayed
    assert (1, 1) == (primary.count, fallback.count)
    assert elapsed < 2.0


VLLM_ENGINE_MESSAGE = (
    "The decoder prompt (length 12324) is longer than the maximum model length of 8192. Make "
    "sure that `max_model_len` is no smaller than the number of text tokens plus multimodal "
    "tokens. For image inputs, the number of image tokens depends on the number of images, and "
    "possibly their aspect ratios as well."
)


@pytest.mark.parametrize(
    "body",
    [
        {
            "object": "error",
            "message": VLLM_ENGINE_MESSAGE,
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        {
            "error": {
                "message": VLLM_ENGINE_MESSAGE,
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        },
    ],
    ids=["vllm-flat", "vllm-wrapped"],
)
async def test_vllms_longer_than_the_maximum_model_length_400_goes_to_the_context_fallback(
    sqlite_dsn: str, body: dict[str, Any]
) -> None:
    """`context_fallbacks` take a 400 `context_length_exceeded` in the shapes vLLM uses for it.
    Besides "This model's maximum context length is ...", vLLM's engine refuses a prompt
    (multimodal ones notably) with "The decoder prompt (length N) is longer than the maximum
    model length of M." — the gateway used to relay that 400 instead of the long-context model."""
    refusal = Step(status=400, body=json.dumps(body).encode())
    async with scripted(refusal, name="p") as primary, scripted(OK, name="long") as long:
        upstreams = [
            upstream("p", [primary.url], ["m"], retry=QUICK),
            upstream("long", [long.url], ["m-long"], retry=QUICK),
        ]
        models = [{"name": "m", "context_fallbacks": ["m-long"]}]
        config = make_config(sqlite_dsn, upstreams, models=models)
        async with serving(config) as gw, aiohttp.ClientSession() as http:
            status, headers, _ = await post(http, gw.v1)
    assert (200, "m-long") == (status, headers["X-Gateway-Model"])
    assert (1, 1) == (primary.count, long.count)
    assert "m-long" == long.seen[0].body["model"]


# --- streaming -----------------------------------------------------------------------------


async def test_a_stream_with_include_usage_reaches_the_openai_client_whole(
    sqlite_dsn: str,
) -> None:
    """`stream_options.include_usage`: the usage event (no choices) is relayed before
    `[DONE]`, and the client's iterator ends cleanly."""
    async with scripted(OK) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])
        async with (
            serving(config) as gw,
            openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0) as client,
        ):
            stream = await client.chat.completions.create(
                model="m",
                messages=CHAT,  # type: ignore[arg-type]
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert answer_text(WORDS) == text
    usage = chunks[-1].usage
    assert usage is not None
    assert 60 == usage.completion_tokens


@pytest.mark.parametrize(
    ("step", "code"),
    [
        (Step(events=5, stall_s=10.0), "UPSTREAM_TIMEOUT"),
        (Step(events=5, cut=True), "UPSTREAM_ERROR"),
    ],
    ids=["stall", "cut"],
)
async def test_a_stream_broken_mid_way_ends_with_the_documented_error_event(
    sqlite_dsn: str, step: Step, code: str
) -> None:
    """dataplane.md "Streaming failures": no continuation possible (a sampled request, one
    upstream), the stream ends with `event: error` whose data is OpenAI's error shape — the
    code says which break: a stall past `stream_idle_timeout_s` is `UPSTREAM_TIMEOUT`, a cut
    `UPSTREAM_ERROR` — after the whole events delivered before it."""
    async with scripted(step) as server:
        entry = upstream("u", [server.url], ["m"], stream_idle_timeout_s=0.5)
        async with serving(make_config(sqlite_dsn, [entry])) as gw, aiohttp.ClientSession() as http:
            status, headers, body = await post(http, gw.v1, {**BODY, "stream": True})
    assert (200, "text/event-stream") == (status, headers["Content-Type"].split(";")[0])
    events = body.decode().split("\n\n")
    assert "" == events[-1]
    assert 5 == sum(1 for e in events if e.startswith("data: {"))
    last = events[-2].split("\n")
    assert "event: error" == last[0]
    error = json.loads(last[1].removeprefix("data: "))["error"]
    assert code == error["code"]
    assert {"message", "type", "code"} == set(error)


# --- idempotency ---------------------------------------------------------------------------


async def test_a_replay_is_served_while_the_upstreams_queue_is_full(sqlite_dsn: str) -> None:
    """DESIGN §3: a replay is served "before admission" — with the upstream's one slot taken
    and its queue full, a new request is refused (503 QUEUE_FULL) while a replay is not."""
    async with scripted(OK, Step(hang_s=3.0), OK) as server:
        entry = upstream("u", [server.url], ["m"], max_inflight=1, max_queue=0)
        async with serving(make_config(sqlite_dsn, [entry])) as gw, aiohttp.ClientSession() as http:
            first = await post(http, gw.v1, headers={"Idempotency-Key": "full-1"})
            pool = gw.gateway.registry.upstream("u").pool
            holder = asyncio.ensure_future(post(http, gw.v1))
            deadline = time.monotonic() + 5
            while pool.inflight < 1:
                assert time.monotonic() < deadline, "the slot was never taken"
                await asyncio.sleep(0.01)
            refused = await post(http, gw.v1)
            replay = await post(http, gw.v1, headers={"Idempotency-Key": "full-1"})
            await holder
    assert 200 == first[0]
    assert (503, "QUEUE_FULL") == (refused[0], json.loads(refused[2])["error"]["code"])
    assert (200, "true") == (replay[0], replay[1]["Idempotent-Replayed"])
    assert first[2] == replay[2]
    assert 2 == server.count


async def test_a_key_whose_gateway_was_killed_mid_request_is_free_once_it_could_not_be_running(
    sqlite_dsn: str,
) -> None:
    """A `gpugate serve` killed (SIGKILL) while a request under a key is in flight leaves the
    key in flight in the store. It used to stay so for `idempotency_ttl_s` (24 h): every retry
    of the client a 409 IDEMPOTENCY_CONFLICT for a day, for a request no process was running.
    Now the key is held in flight only as long as its request could last (here: one try of at
    most 2 s after at most 1 s of queueing, plus the waits — a few seconds), then the retry is
    served by the gateway that took over the store."""
    retry = {"attempts": 1, "backoff_s": 0, "max_backoff_s": 0, "retry_after_max_s": 0.5}
    entry_args = {"retry": retry, "timeout_s": 2, "queue_timeout_s": 1}
    key = {"Idempotency-Key": "killed-1"}
    async with scripted(Step(hang_s=30.0), OK) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], **entry_args)])
        async with aiohttp.ClientSession() as http:
            async with serve_process(config, workers=None) as (url, proc, _):
                first = asyncio.ensure_future(post(http, url + "/v1", headers=key))
                deadline = time.monotonic() + 10
                while server.count < 1:
                    assert time.monotonic() < deadline, "the first request never arrived"
                    await asyncio.sleep(0.01)
                proc.kill()  # the gateway dies with the key in flight
                proc.wait(timeout=10)
                with pytest.raises(aiohttp.ClientError):
                    await first
            async with serve_process(config, workers=None) as (url, _, _):
                statuses = []
                deadline = time.monotonic() + 20
                while True:
                    status, headers, body = await post(http, url + "/v1", headers=key)
                    statuses.append(status)
                    if status != 409:
                        break
                    assert time.monotonic() < deadline, f"still 409 after 20 s: {statuses[:3]}"
                    await asyncio.sleep(0.25)
    assert 200 == status, body
    assert answer_text(WORDS) == json.loads(body)["choices"][0]["message"]["content"]
    assert "Idempotent-Replayed" not in headers
    assert 409 == statuses[0]  # while it could still be running, a duplicate is refused


@pytest.mark.parametrize("plane", ["fast", "asgi"])
async def test_idempotency_key_limits_are_the_clients_own_in_keys_mode_too(
    sqlite_dsn: str, monkeypatch: pytest.MonkeyPatch, plane: str
) -> None:
    """docs/api.md: an `Idempotency-Key` is 1-255 characters, no control characters (else 400).
    With `auth.mode: keys` the door puts the tenant in front of the key (`team-a:<key>`), and
    the limits were checked on that: a 255-character key was refused, an empty one taken as a
    key (`team-a:`). In `open` mode a tab inside a key was taken. The client's own key is what
    is checked now, in both modes."""
    monkeypatch.setenv("GPUGATE_FASTPATH", "1" if plane == "fast" else "0")
    async with scripted(OK) as server:
        keyed = keyed_config(sqlite_dsn, [server.url], ["m"])
        open_mode = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])
        async with serving(keyed, environ=ENVIRON) as gw, aiohttp.ClientSession() as http:
            secret = (await create_key(http, gw.url))["key"]
            got = {}
            for key in ("k" * 255, "", "a\tb", "k" * 256):
                status, _, _ = await post(
                    http, gw.v1, headers={**bearer(secret), "Idempotency-Key": key}
                )
                got[key] = status
            replay = await post(
                http, gw.v1, headers={**bearer(secret), "Idempotency-Key": "k" * 255}
            )
        async with serving(open_mode) as gw, aiohttp.ClientSession() as http:
            tab = (await post(http, gw.v1, headers={"Idempotency-Key": "a\tb"}))[0]
    assert {"k" * 255: 200, "": 400, "a\tb": 400, "k" * 256: 400} == got
    assert "true" == replay[1]["Idempotent-Replayed"]
    assert 400 == tab
