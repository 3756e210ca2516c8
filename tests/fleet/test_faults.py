"""Each fault rule of the fake model server does what a real provider does, and the request log
shows what the server saw."""

from __future__ import annotations

import asyncio
import email.utils
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from gpugate.fleet import (
    ControlError,
    Fault,
    Fleet,
    FleetSpec,
    ModelServer,
    ServerBehaviour,
    ServerSpec,
    gaps,
    token_text,
)

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

Until = Callable[[Callable[[], bool]], Awaitable[None]]
MODEL = "alpha-7b"
TOKENS = 12


def ask(prompt: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": prompt}]


@pytest.fixture
async def tokens() -> AsyncIterator[ModelServer]:
    """A server answering TOKENS deterministic tokens, one per chunk."""
    behaviour = ServerBehaviour(answer_tokens=TOKENS)
    async with ModelServer([MODEL, "beta-7b"], name="alpha", behaviour=behaviour) as running:
        yield running


@pytest.fixture
async def client(tokens: ModelServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{tokens.url}/v1", api_key="x", max_retries=0) as c:
        yield c


async def streamed(
    client: AsyncOpenAI, prompt: str, into: list[str] | None = None, **options: Any
) -> list[str]:
    """The content pieces of a chat stream (also appended to `into` as they come, so a caller
    sees how far it got when an error propagates)."""
    received: list[str] = [] if into is None else into
    stream = await client.chat.completions.create(
        model=options.pop("model", MODEL), messages=ask(prompt), stream=True, **options
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            received.append(chunk.choices[0].delta.content)  # noqa: PERF401 - kept on error
    return received


async def test_answer_tokens_is_deterministic_per_model_and_prompt_and_equal_streamed(
    client: AsyncOpenAI,
) -> None:
    plain = await client.chat.completions.create(model=MODEL, messages=ask("p"))
    pieces = await streamed(client, "p")
    other_model = await client.chat.completions.create(model="beta-7b", messages=ask("p"))

    assert token_text(MODEL, "p", TOKENS) == plain.choices[0].message.content
    assert token_text(MODEL, "p", TOKENS) == "".join(pieces)
    assert TOKENS == len(pieces) == len(token_text(MODEL, "p", TOKENS).split())
    assert token_text("beta-7b", "p", TOKENS) == other_model.choices[0].message.content
    assert other_model.choices[0].message.content != plain.choices[0].message.content


async def test_an_assistant_prefill_is_continued_after_its_words(client: AsyncOpenAI) -> None:
    full = token_text(MODEL, "p", TOKENS)
    given = " ".join(full.split()[:5])
    messages: list[ChatCompletionMessageParam] = [
        *ask("p"),
        {"role": "assistant", "content": given},
    ]

    rest = await client.chat.completions.create(model=MODEL, messages=messages)

    assert full == given + (rest.choices[0].message.content or "")


async def test_the_echo_answer_continues_after_a_prefill_that_starts_it() -> None:
    async with (
        ModelServer([MODEL], name="alpha") as server,
        AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as c,
    ):
        messages: list[ChatCompletionMessageParam] = [
            *ask("hi there"),
            {"role": "assistant", "content": "alpha answers:"},
        ]
        rest = await c.chat.completions.create(model=MODEL, messages=messages)

    assert " hi there" == rest.choices[0].message.content


async def test_status_429_carries_retry_after_in_seconds_and_then_the_server_answers(
    tokens: ModelServer, client: AsyncOpenAI
) -> None:
    tokens.inject("status", status=429, retry_after_s=2, count=1)

    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model=MODEL, messages=ask("p"))
    answered = await client.chat.completions.create(model=MODEL, messages=ask("p"))

    assert "2" == caught.value.response.headers["Retry-After"]
    assert isinstance(caught.value.body, dict)
    assert "rate_limit_exceeded" == caught.value.body["code"]
    assert answered.choices[0].message.content == token_text(MODEL, "p", TOKENS)


async def test_status_429_without_retry_after_has_no_such_header(
    tokens: ModelServer, client: AsyncOpenAI
) -> None:
    tokens.inject("status", status=429)

    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model=MODEL, messages=ask("p"))

    assert "Retry-After" not in caught.value.response.headers


async def test_retry_after_as_an_http_date_is_never_sooner_than_asked(
    tokens: ModelServer, client: AsyncOpenAI
) -> None:
    tokens.inject("status", status=429, retry_after_s=3, retry_after_date=True)
    asked_at = time.time()

    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model=MODEL, messages=ask("p"))

    when = email.utils.parsedate_to_datetime(caught.value.response.headers["Retry-After"])
    assert asked_at + 3 <= when.timestamp() <= asked_at + 5


async def test_500_once_fails_exactly_the_next_request(
    tokens: ModelServer, client: AsyncOpenAI
) -> None:
    tokens.inject("status", status=500, count=1)

    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model=MODEL, messages=ask("p"))
    second = await client.chat.completions.create(model=MODEL, messages=ask("p"))

    assert second.choices[0].message.content
    assert [(1, 500, "status"), (2, 200, None)] == [
        (seen["attempt"], seen["status"], seen["fault"]) for seen in tokens.log.of("p")
    ]


async def test_503_persists_until_the_rule_is_cleared(
    tokens: ModelServer, client: AsyncOpenAI
) -> None:
    tokens.inject("status", status=503)
    for _ in range(3):
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model=MODEL, messages=ask("p"))

    tokens.clear_faults()

    assert await client.chat.completions.create(model=MODEL, messages=ask("p"))
    assert [503, 503, 503, 200] == [seen["status"] for seen in tokens.log.of("p")]


async def test_a_rule_for_one_model_leaves_the_others_alone(
    tokens: ModelServer, client: AsyncOpenAI
) -> None:
    tokens.inject("status", status=503, model="beta-7b")

    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="beta-7b", messages=ask("p"))
    assert await client.chat.completions.create(model=MODEL, messages=ask("p"))


async def test_a_rule_armed_for_a_while_expires(tokens: ModelServer, client: AsyncOpenAI) -> None:
    tokens.inject("status", status=503, for_s=0.3)
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model=MODEL, messages=ask("p"))

    deadline = time.monotonic() + 5
    while tokens.faults.as_json()[0]["active"]:
        assert time.monotonic() < deadline, "the rule did not expire"
        await asyncio.sleep(0.05)

    assert await client.chat.completions.create(model=MODEL, messages=ask("p"))


@pytest.mark.parametrize("stream", [False, True])
async def test_reset_aborts_before_any_byte(
    tokens: ModelServer, client: AsyncOpenAI, stream: bool
) -> None:
    tokens.inject("reset")

    with pytest.raises(openai.APIConnectionError):
        await (
            streamed(client, "p")
            if stream
            else client.chat.completions.create(model=MODEL, messages=ask("p"))
        )

    assert 1 == tokens.stats.resets
    assert [("reset", None)] == [(s["fault"], s["status"]) for s in tokens.log.of("p")]


async def test_silent_accepts_and_never_answers(
    tokens: ModelServer, client: AsyncOpenAI, until: Until
) -> None:
    tokens.inject("silent")

    with pytest.raises(openai.APITimeoutError):
        await client.chat.completions.create(model=MODEL, messages=ask("p"), timeout=0.5)

    await until(lambda: tokens.stats.open_requests == 0)
    assert 1 == tokens.stats.disconnects
    assert [None] == [seen["status"] for seen in tokens.log.of("p")]


async def test_slow_first_token_sends_headers_at_once_and_the_first_event_later(
    tokens: ModelServer,
) -> None:
    tokens.inject("slow_first_token", seconds=0.5)
    body = {"model": MODEL, "messages": ask("p"), "stream": True}
    async with aiohttp.ClientSession() as http:
        sent = time.monotonic()
        async with http.post(f"{tokens.url}/v1/chat/completions", json=body) as response:
            headers_after = time.monotonic() - sent
            await response.content.readline()
            first_event_after = time.monotonic() - sent
            rest = await response.read()

    assert headers_after < 0.5 <= first_event_after
    assert rest.endswith(b"data: [DONE]\n\n")


async def test_cut_resets_a_stream_after_that_many_tokens(
    tokens: ModelServer, client: AsyncOpenAI
) -> None:
    tokens.inject("cut", after=5)
    received: list[str] = []

    with pytest.raises(openai.APIConnectionError):
        await streamed(client, "p", into=received)

    assert token_text(MODEL, "p", TOKENS).split()[:5] == "".join(received).split()
    assert 1 == tokens.stats.resets


async def test_stall_goes_silent_mid_stream_then_carries_on(tokens: ModelServer) -> None:
    tokens.inject("stall", after=4, seconds=0.6)
    body = {"model": MODEL, "messages": ask("p"), "stream": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{tokens.url}/v1/chat/completions", json=body) as response:
            arrivals = [
                time.monotonic() async for line in response.content if line.startswith(b"data: ")
            ]

    silences = gaps([{"at": at} for at in arrivals])
    assert 1 + TOKENS + 1 + 1 == len(arrivals)  # role, tokens, finish, [DONE]
    longest = max(range(len(silences)), key=silences.__getitem__)
    # read times, not send times: a late read of the token before the stall shortens the gap seen
    assert silences[longest] >= 0.5
    assert 1 + 4 - 1 == longest  # between the 4th token and the 5th


async def test_malformed_puts_an_event_that_is_not_json_in_the_stream(
    tokens: ModelServer, client: AsyncOpenAI
) -> None:
    tokens.inject("malformed", after=3)
    body = {"model": MODEL, "messages": ask("p"), "stream": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{tokens.url}/v1/chat/completions", json=body) as response:
            raw = await response.read()
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e.strip()]

    broken = [e for e in events if e != b"[DONE]" and not _is_json(e)]
    assert 1 == len(broken)
    tokens.inject("malformed", after=3)
    with pytest.raises(json.JSONDecodeError):
        await streamed(client, "p")


async def test_malformed_truncates_a_non_streamed_answer(
    tokens: ModelServer, client: AsyncOpenAI
) -> None:
    tokens.inject("malformed", after=0, stream=False)

    with pytest.raises(json.JSONDecodeError):
        await client.chat.completions.create(model=MODEL, messages=ask("p"))


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


async def test_no_done_ends_cleanly_without_done_after_the_finish_chunk(
    tokens: ModelServer,
) -> None:
    tokens.inject("no_done")
    body = {"model": MODEL, "messages": ask("p"), "stream": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{tokens.url}/v1/chat/completions", json=body) as response:
            raw = await response.read()

    assert b"[DONE]" not in raw
    assert b'"finish_reason":"stop"' in raw


async def test_no_done_after_k_tokens_ends_cleanly_mid_answer(tokens: ModelServer) -> None:
    tokens.inject("no_done", after=3)
    body = {"model": MODEL, "messages": ask("p"), "stream": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{tokens.url}/v1/chat/completions", json=body) as response:
            raw = await response.read()

    assert b"[DONE]" not in raw
    assert b'"finish_reason":"stop"' not in raw
    assert 1 + 3 == raw.count(b"data: ")


async def test_context_length_is_openais_400(tokens: ModelServer, client: AsyncOpenAI) -> None:
    tokens.inject("context_length")

    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=MODEL, messages=ask("p"))

    body = caught.value.body
    assert isinstance(body, dict)
    assert "context_length_exceeded" == body["code"]
    assert "invalid_request_error" == body["type"]
    assert "messages" == body["param"]
    assert str(body["message"]).startswith("This model's maximum context length is ")


@pytest.mark.parametrize(
    ("style", "code"), [("openai", "content_policy_violation"), ("azure", "content_filter")]
)
async def test_content_filter_is_the_providers_400(
    tokens: ModelServer, client: AsyncOpenAI, style: str, code: str
) -> None:
    tokens.inject("content_filter", style=style)

    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=MODEL, messages=ask("p"))

    assert isinstance(caught.value.body, dict)
    assert code == caught.value.body["code"]


async def test_reject_prefill_refuses_only_a_trailing_assistant_message(
    tokens: ModelServer, client: AsyncOpenAI
) -> None:
    tokens.inject("reject_prefill")
    prefilled: list[ChatCompletionMessageParam] = [
        *ask("p"),
        {"role": "assistant", "content": "amber"},
    ]

    assert await client.chat.completions.create(model=MODEL, messages=ask("p"))
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model=MODEL, messages=prefilled)
    assert await client.chat.completions.create(model=MODEL, messages=ask("p"))

    log = tokens.log.of("p")
    assert [(None, None), ("amber", "reject_prefill"), (None, None)] == [
        (seen["prefill"], seen["fault"]) for seen in log
    ]
    assert [1, 2, 3] == [seen["attempt"] for seen in log]  # a prefill is the same request


async def test_the_log_counts_attempts_per_request_and_their_gaps(
    tokens: ModelServer, client: AsyncOpenAI
) -> None:
    await client.chat.completions.create(model=MODEL, messages=ask("one"))
    await client.chat.completions.create(model=MODEL, messages=ask("two"))
    await asyncio.sleep(0.2)  # the gap measured below, not a wait for anything
    await client.chat.completions.create(
        model=MODEL, messages=ask("one"), extra_headers={"Idempotency-Key": "k1"}
    )

    ones = tokens.log.of("one")
    assert [1, 2] == [seen["attempt"] for seen in ones]
    assert [None, "k1"] == [seen["key"] for seen in ones]
    assert gaps(ones)[0] >= 0.2
    assert ask("one") == ones[0]["messages"]


async def test_control_api_arms_lists_and_clears_rules_and_shows_the_log(
    tokens: ModelServer, client: AsyncOpenAI
) -> None:
    async with aiohttp.ClientSession() as http:
        rules = {"faults": [{"kind": "status", "status": 503, "count": 1}, {"kind": "reset"}]}
        async with http.post(f"{tokens.url}/_control/faults", json=rules) as response:
            assert 200 == response.status
            armed = await response.json()
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model=MODEL, messages=ask("p"))
        async with http.get(f"{tokens.url}/_control/faults") as response:
            listed = (await response.json())["faults"]
        async with http.delete(f"{tokens.url}/_control/faults") as response:
            assert 200 == response.status
        async with http.get(f"{tokens.url}/_control/log?since=0") as response:
            log = (await response.json())["requests"]

    assert 2 == len(armed["armed"])
    assert [0, None] == [rule["remaining"] for rule in listed]
    assert [False, True] == [rule["active"] for rule in listed]
    assert [] == tokens.faults.as_json()
    assert [("p", 503, "status")] == [(s["prompt"], s["status"], s["fault"]) for s in log]


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "meteor"},
        {"status": 503},
        {"kind": "cut"},
        {"kind": "status", "status": 200},
        {"kind": "status", "count": 0},
        {"kind": "stall", "after": 1, "seconds": -1},
        {"kind": "content_filter", "style": "other"},
        {"kind": "status", "unknown": 1},
        {"faults": "no"},
        [],
    ],
)
async def test_control_api_refuses_a_bad_rule_and_arms_nothing(
    tokens: ModelServer, bad: object
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{tokens.url}/_control/faults", json=bad) as response:
            assert 400 == response.status
            assert "error" in await response.json()

    assert [] == tokens.faults.as_json()


def test_inject_in_process_is_validated_like_the_control_api() -> None:
    server = ModelServer(["m"], name="s")

    with pytest.raises(ControlError, match="after"):
        server.inject("stall", seconds=1)


async def test_down_for_refuses_connections_then_listens_again_on_the_same_port(
    tokens: ModelServer, client: AsyncOpenAI
) -> None:
    url = tokens.url
    await tokens.down_for(0.5)

    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))
    deadline = time.monotonic() + 5
    while not tokens.up:
        assert time.monotonic() < deadline, "the server did not come back"
        await asyncio.sleep(0.05)

    assert url == tokens.url
    assert await client.chat.completions.create(model=MODEL, messages=ask("p"))


async def test_control_down_answers_then_goes_down(tokens: ModelServer) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{tokens.url}/_control/down", json={"for_s": 30}) as response:
            assert 202 == response.status
        deadline = time.monotonic() + 5
        while tokens.up:
            assert time.monotonic() < deadline, "the server did not go down"
            await asyncio.sleep(0.02)
        with pytest.raises(aiohttp.ClientConnectorError):
            await http.get(f"{tokens.url}/health")


async def test_reset_restores_the_faults_a_server_was_built_with_and_empties_the_log() -> None:
    built = (Fault(kind="reject_prefill", model="fb"),)
    spec = FleetSpec(servers=(ServerSpec("s", ("fb",), faults=built),))
    async with Fleet(spec) as fleet:
        server = fleet.servers["s"]
        server.inject("status", status=503)
        async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as c:
            with pytest.raises(openai.InternalServerError):
                await c.chat.completions.create(model="fb", messages=ask("p"))
        server.reset()

        assert ["reject_prefill"] == [rule["kind"] for rule in server.faults.as_json()]
        assert [] == server.log.entries()


async def test_a_rule_built_in_process_is_armed_like_one_sent_to_the_control_api(
    tokens: ModelServer, client: AsyncOpenAI
) -> None:
    ident = tokens.arm(Fault(kind="status", status=502, count=1))

    with pytest.raises(openai.InternalServerError) as caught:
        await client.chat.completions.create(model=MODEL, messages=ask("p"))

    assert 502 == caught.value.status_code
    assert [(ident, 0)] == [(rule["id"], rule["remaining"]) for rule in tokens.faults.as_json()]
