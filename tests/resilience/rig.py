"""The resilience rig: a real gateway on a loopback socket in front of two fake providers — the
primary model ``m`` and its fallback ``fb`` — and the real ``openai`` client (which never
retries here: every rescue is the gateway's).

Both providers answer 60 deterministic tokens per model (`token_text`), so a test knows the
complete answer of each model byte for byte, and each logs what it saw (`ModelServer.log`), so a
test pins the attempts and their gaps. Requests ask for ``temperature: 0``: a deterministic
request, the kind a gateway may replay to continue a broken stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from gpugate.fleet import Fault, ModelServer, ServerBehaviour, token_text
from harness import RunningGateway, make_config, serving, upstream

PRIMARY = "m"
FALLBACK = "fb"
TOKENS = 60
CUT_AT = 40
"""Where a broken stream breaks: after 40 of its 60 tokens."""
DEADLINE_S = 1.5
"""first_byte / first_token / stream_idle timeout of both upstreams."""
RETRY = {"attempts": 3, "backoff_s": 0.1, "max_backoff_s": 0.5, "retry_after_max_s": 5}
ATTEMPTS = 3
WAIT_PER_TRY_S = 4.0
"""The longest a gateway may reasonably wait before one more try after a load signal (a
``Retry-After: 2`` written as an HTTP date rounds up to 3-4 s; its own back-off of a 429/503)."""
SLACK_S = 6.0
"""What a loaded 2-core machine may add to a bound (never what a test waits for)."""
CLIENT_BOUND_S = 45.0
"""Past this the request hangs: the test fails rather than waits."""


def complete(model: str, prompt: str) -> str:
    """The whole answer of `model` to `prompt`."""
    return token_text(model, prompt, TOKENS)


def continued_on_fallback(prompt: str, after: int = CUT_AT) -> str:
    """The primary's first `after` tokens, then the fallback's continuation after that prefill."""
    primary = complete(PRIMARY, prompt).split()
    fallback = complete(FALLBACK, prompt).split()
    return " ".join(primary[:after] + fallback[after:])


def rescued_texts(prompt: str) -> set[str]:
    """What a rescued broken stream may read: the primary's answer replayed whole, or the
    primary's 40 tokens continued on the fallback after a prefill of them."""
    return {complete(PRIMARY, prompt), continued_on_fallback(prompt)}


@dataclass
class Outcome:
    """What the client got: the text, how it ended, the gateway's headers, how long it took."""

    text: str = ""
    finish_reason: str | None = None
    status: int | None = None
    error: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0
    not_json: bool = False  # the client was handed a body or an event it could not parse

    @property
    def answered(self) -> bool:
        return self.error is None and self.finish_reason == "stop"

    @property
    def model(self) -> str | None:
        return self.headers.get("x-gateway-model")

    @property
    def attempts(self) -> int | None:
        value = self.headers.get("x-gateway-attempts")
        return None if value is None else int(value)


@dataclass
class Rig:
    gateway: RunningGateway
    primary: ModelServer
    fallback: ModelServer
    client: AsyncOpenAI
    http: aiohttp.ClientSession
    _prompts: itertools.count[int] = field(default_factory=itertools.count)

    def prompt(self, what: str) -> str:
        """A prompt no other request of this rig used, so the logs tell its requests apart."""
        return f"{what} #{next(self._prompts)}"

    def seen(self, prompt: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """What the primary and the fallback saw of `prompt`."""
        return self.primary.log.of(prompt), self.fallback.log.of(prompt)

    async def ask(self, prompt: str, *, stream: bool, model: str = PRIMARY) -> Outcome:
        """One chat request through the gateway with the real client, bounded."""
        out = Outcome()
        started = time.monotonic()
        try:
            async with asyncio.timeout(CLIENT_BOUND_S):
                await self._ask(out, prompt, stream=stream, model=model)
        except TimeoutError:
            raise AssertionError(f"no answer within {CLIENT_BOUND_S} s: a hang") from None
        except openai.APIStatusError as exc:
            out.status, out.error = exc.status_code, exc.body
            out.headers = {k.lower(): v for k, v in exc.response.headers.items()}
        except openai.APIError as exc:  # a stream that ended in an error event, or broke
            out.error = exc.message
        except json.JSONDecodeError as exc:
            out.error, out.not_json = f"the client could not parse what it got: {exc}", True
        out.elapsed_s = time.monotonic() - started
        return out

    async def _ask(self, out: Outcome, prompt: str, *, stream: bool, model: str) -> None:
        messages: Any = [{"role": "user", "content": prompt}]
        create = self.client.chat.completions.with_raw_response.create
        if not stream:
            raw = await create(model=model, messages=messages, temperature=0)
            out.headers = {k.lower(): v for k, v in raw.headers.items()}
            completion = raw.parse()
            out.text = completion.choices[0].message.content or ""
            out.finish_reason = completion.choices[0].finish_reason
            return
        raw_stream = await create(model=model, messages=messages, temperature=0, stream=True)
        out.headers = {k.lower(): v for k, v in raw_stream.headers.items()}
        async for chunk in raw_stream.parse():
            for choice in chunk.choices:
                out.text += choice.delta.content or ""
                out.finish_reason = choice.finish_reason or out.finish_reason

    async def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """The gateway's ``/metrics``, parsed by the real Prometheus parser."""
        async with self.http.get(self.gateway.url + "/metrics") as response:
            text = await response.text()
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    async def healthy(self, *, within_s: float = 15.0) -> None:
        """With every fault cleared, the gateway is ready and serves the primary again (the
        primary back from any ejection) within `within_s`."""
        self.primary.clear_faults()
        self.fallback.clear_faults()
        async with self.http.get(self.gateway.url + "/readyz") as response:
            assert 200 == response.status, await response.text()
        deadline = time.monotonic() + within_s
        while True:
            prompt = self.prompt("health check")
            out = await self.ask(prompt, stream=False)
            if out.answered and out.model == PRIMARY:
                assert complete(PRIMARY, prompt) == out.text
                return
            assert out.answered or out.status in (429, 502, 503, 504), out
            if time.monotonic() > deadline:
                raise AssertionError(f"the primary did not serve again within {within_s} s")
            await asyncio.sleep(0.2)


def gateway_upstream(uid: str, url: str, model: str, **extra: Any) -> dict[str, Any]:
    return upstream(
        uid,
        [url],
        [model],
        retry=RETRY,
        first_byte_timeout_s=DEADLINE_S,
        first_token_timeout_s=DEADLINE_S,
        stream_idle_timeout_s=DEADLINE_S,
        timeout_s=30,
        **extra,
    )


@contextlib.asynccontextmanager
async def running_rig(
    store: str,
    *,
    with_fallback: bool,
    primary_faults: tuple[Fault, ...] = (),
    fallback_faults: tuple[Fault, ...] = (),
) -> AsyncIterator[Rig]:
    """The rig, with `models: [{name: m, fallbacks: [fb], context_fallbacks: [fb]}]` when
    `with_fallback`; the fallback accepts an assistant prefill (`continuation: prefill`)."""
    behaviour = ServerBehaviour(answer_tokens=TOKENS)
    async with (
        ModelServer([PRIMARY], name="primary", behaviour=behaviour, faults=primary_faults) as p,
        ModelServer([FALLBACK], name="fallback", behaviour=behaviour, faults=fallback_faults) as f,
    ):
        upstreams = [
            gateway_upstream("primary", p.url, PRIMARY),
            gateway_upstream("fallback", f.url, FALLBACK, continuation="prefill"),
        ]
        extra: dict[str, Any] = {}
        if with_fallback:
            extra["models"] = [
                {"name": PRIMARY, "fallbacks": [FALLBACK], "context_fallbacks": [FALLBACK]}
            ]
        config = make_config(store, upstreams, **extra)
        async with (
            serving(config, probe_interval_s=0.5) as gw,
            AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0, timeout=60) as client,
            aiohttp.ClientSession() as http,
        ):
            yield Rig(gw, p, f, client, http)


def attempts_within(seen: list[dict[str, Any]], seconds: float) -> int:
    """How many of `seen` arrived within `seconds` of the first."""
    if not seen:
        return 0
    first = float(seen[0]["at"])
    return sum(1 for entry in seen if float(entry["at"]) - first <= seconds)
