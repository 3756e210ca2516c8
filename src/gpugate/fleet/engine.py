"""A simulated LLM engine (vLLM-like) with a real prefix cache, behind a fake model server.

What it models, and what a router can gain from knowing it:

- **Sequences and a queue.** At most ``max_seqs`` requests run at once; the rest wait in FIFO
  order (``vllm:num_requests_running`` / ``vllm:num_requests_waiting``). A request is also held
  back while the KV cache cannot hold it.
- **A KV cache of ``kv_blocks`` blocks of ``block_size`` tokens**, with vLLM's automatic prefix
  caching: each full block of a sequence is named by a hash chained over every token before it;
  a new request reuses the longest run of leading blocks still in the cache. Blocks of running
  requests are pinned; a finished request's blocks (its prompt *and* its answer, so the next turn
  of a chat hits on the whole history) stay cached until evicted, least recently used first.
  ``vllm:kv_cache_usage_perc`` is the pinned share, as in vLLM v1 (cached, evictable blocks count
  as free).
- **Time.** Time to first token = waiting for a slot + waiting for the engine's one prefill lane
  (prefills run one at a time, FIFO: a long prompt delays the others, as compute does) + prefill
  of the *uncached* prompt tokens at ``prefill_s_per_token``. Then one token every
  ``decode_s_per_token * (1 + batch_slowdown * (running - 1))`` seconds: decode slows with the
  batch. ``slowdown`` multiplies every duration (a slower GPU).
- **LoRA.** A request whose model is one of ``lora_adapters`` needs that adapter resident; at
  most ``max_loras`` are (LRU), and loading one costs ``lora_load_s`` on the prefill lane.
  ``vllm:lora_requests_info`` lists the adapters of running and waiting requests, as vLLM does.

Tokens are whitespace-separated words; a chat is rendered ``<|role|> words...`` per message and
ends with ``<|assistant|>`` (the generation prompt), so turn *n + 1* starts with every token of
turn *n*, its answer included.

:class:`Engine` is the simulation (no HTTP); :func:`serve` answers one model request with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gpugate.fleet.control import Check, ControlError, integer, number, patched
from gpugate.fleet.replies import cut, error_body

if TYPE_CHECKING:
    from gpugate.fleet.replies import Completion

_HOUR_S = 3600.0
GENERATION_PROMPT = "<|assistant|>"
_RUNNING_HELP = "Number of requests in model execution batches."
_WAITING_HELP = "Number of requests waiting to be processed."
_KV_HELP = "KV-cache usage. 1 means 100 percent usage."
_QUERIES_HELP = "Prefix cache queries, in terms of number of queried tokens."
_HITS_HELP = "Prefix cache hits, in terms of number of cached tokens."
_PROMPT_HELP = "Number of prefill tokens processed."
_GENERATED_HELP = "Number of generation tokens processed."


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """The shape and speed of one simulated engine; the defaults are a small GPU, scaled down.

    Times are seconds. See the module docstring for what each knob does.
    """

    max_seqs: int = 8
    kv_blocks: int = 2048
    block_size: int = 16
    prefill_s_per_token: float = 20e-6
    decode_s_per_token: float = 2e-3
    batch_slowdown: float = 0.05
    max_tokens: int = 16  # answer length when the request names none
    lora_adapters: tuple[str, ...] = ()
    max_loras: int = 2
    lora_load_s: float = 0.05
    slowdown: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora_adapters", tuple(self.lora_adapters))
        if self.max_seqs < 1 or self.kv_blocks < 1 or self.block_size < 1 or self.max_loras < 1:
            raise ValueError("max_seqs, kv_blocks, block_size and max_loras must be at least 1")
        if min(self.prefill_s_per_token, self.decode_s_per_token, self.lora_load_s) < 0:
            raise ValueError("times must not be negative")
        if self.slowdown <= 0 or self.batch_slowdown < 0:
            raise ValueError("slowdown must be positive and batch_slowdown not negative")

    def patched(self, patch: object) -> EngineSpec:
        """This spec with the fields of a JSON control body replaced (ControlError if bad)."""
        return patched(self, patch, _CHECKS)


_CHECKS: MappingProxyType[str, Check] = MappingProxyType(
    {
        "prefill_s_per_token": number(0.0, 1.0),
        "decode_s_per_token": number(0.0, 60.0),
        "batch_slowdown": number(0.0, 10.0),
        "max_tokens": integer(1, 4096),
        "lora_load_s": number(0.0, _HOUR_S),
        "slowdown": number(0.01, 1000.0),
    }
)
"""What may change at runtime (``POST /_control/engine``); the cache's shape may not."""


class EngineRefusedError(ValueError):
    """The request can never run here (its sequence is larger than the whole KV cache)."""


def chat_tokens(messages: Sequence[object]) -> list[str]:
    """A chat rendered as tokens: ``<|role|>`` and the words of each message, then the
    generation prompt."""
    out: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        out.append(f"<|{message.get('role', '')}|>")
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        out += str(content or "").split()
    out.append(GENERATION_PROMPT)
    return out


def block_hashes(tokens: Sequence[str], block_size: int) -> list[int]:
    """The chained hash of each full block of ``tokens``: block *i*'s names blocks 0..i."""
    hashes: list[int] = []
    previous = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        previous = hash((previous, *tokens[start : start + block_size]))
        hashes.append(previous)
    return hashes


@dataclass(slots=True, eq=False)
class _Sequence:
    model: str
    tokens: list[str]
    hashes: list[int]
    blocks: int  # every block the whole sequence (prompt and answer) needs
    admitted: asyncio.Future[None]
    pinned: list[int] = dataclasses.field(default_factory=list)
    anonymous: int = 0  # blocks held that have no hash (the partial one, the answer's)
    cached_tokens: int = 0
    final: list[str] | None = None  # the whole sequence, once answered


class Run:
    """One admitted request: ``await step()`` for each token; ``done(tokens)`` names the whole
    sequence (prompt and answer) so its full blocks stay cached for the next turn."""

    def __init__(self, engine: Engine, seq: _Sequence, n_tokens: int) -> None:
        self._engine = engine
        self._seq = seq
        self._left = n_tokens
        self._first = True

    async def step(self) -> None:
        if self._left <= 0:
            raise RuntimeError("more steps than tokens asked for")
        engine = self._engine
        if self._first:
            self._first = False
            await engine.prefill(self._seq)
        else:
            spec = engine.spec
            slower = 1 + spec.batch_slowdown * (engine.running - 1)
            await asyncio.sleep(spec.decode_s_per_token * slower * spec.slowdown)
        self._left -= 1
        engine.generated_tokens += 1

    def done(self, tokens: list[str]) -> None:
        self._seq.final = tokens


class Engine:
    """One simulated engine. ``async with engine.run(model, tokens, n) as active`` admits a
    request, and each ``await active.step()`` returns when the next of its ``n`` tokens is out (the
    first after queueing and prefill). Leaving the block frees the sequence's slot and caches
    its blocks, finished or cancelled."""

    def __init__(self, spec: EngineSpec | None = None) -> None:
        self.spec = spec or EngineSpec()
        self._waiting: deque[_Sequence] = deque()
        self._running: set[_Sequence] = set()
        self._refs: dict[int, int] = {}  # pinned hashed blocks -> holders
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unpinned; LRU first
        self._empty = self.spec.kv_blocks
        self._prefill = asyncio.Lock()
        self._loras: OrderedDict[str, None] = OrderedDict()
        self.prompt_tokens = 0
        self.cached_tokens = 0  # vllm:prefix_cache_hits_total
        self.generated_tokens = 0
        self.finished = 0

    def __repr__(self) -> str:
        return (
            f"<Engine running={len(self._running)} waiting={len(self._waiting)}"
            f" kv={self.kv_usage:.2f} cached={len(self._evictable)} finished={self.finished}>"
        )

    def update(self, patch: object) -> EngineSpec:
        self.spec = self.spec.patched(patch)
        return self.spec

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_usage(self) -> float:
        pinned = self.spec.kv_blocks - self._empty - len(self._evictable)
        return pinned / self.spec.kv_blocks

    def cached_prefix_tokens(self, tokens: Sequence[str]) -> int:
        """How many leading tokens of ``tokens`` are in the cache now (for tests)."""
        return self._cached_run(block_hashes(tokens, self.spec.block_size)) * self.spec.block_size

    @asynccontextmanager
    async def run(self, model: str, tokens: list[str], n_tokens: int) -> AsyncIterator[Run]:
        spec = self.spec
        blocks = math.ceil((len(tokens) + n_tokens) / spec.block_size)
        if blocks > spec.kv_blocks:
            raise EngineRefusedError(
                f"the sequence needs {blocks} KV blocks; this engine has {spec.kv_blocks}"
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        seq = _Sequence(model, tokens, block_hashes(tokens, spec.block_size), blocks, future)
        self._waiting.append(seq)
        self._schedule()
        try:
            await seq.admitted
            yield Run(self, seq, n_tokens)
        finally:
            self._finish(seq)

    async def prefill(self, seq: _Sequence) -> None:
        """Wait for the prefill lane, then prefill the uncached part (and load a LoRA)."""
        async with self._prefill:
            spec = self.spec
            seconds = (len(seq.tokens) - seq.cached_tokens) * spec.prefill_s_per_token
            if seq.model in spec.lora_adapters:
                if seq.model in self._loras:
                    self._loras.move_to_end(seq.model)
                else:
                    seconds += spec.lora_load_s
                    self._loras[seq.model] = None
                    while len(self._loras) > spec.max_loras:
                        self._loras.popitem(last=False)
            await asyncio.sleep(seconds * spec.slowdown)

    # -- the scheduler and the cache --------------------------------------------------------

    def _cached_run(self, hashes: Sequence[int]) -> int:
        run = 0
        for h in hashes:
            if h not in self._refs and h not in self._evictable:
                break
            run += 1
        return run

    def _schedule(self) -> None:
        """Admit waiting requests in order while a slot and enough KV blocks are free."""
        while self._waiting and len(self._running) < self.spec.max_seqs:
            seq = self._waiting[0]
            if seq.admitted.done():  # its client left while it waited
                self._waiting.popleft()
                continue
            if not self._admit(seq):
                return
            self._waiting.popleft()
            self._running.add(seq)
            seq.admitted.set_result(None)

    def _admit(self, seq: _Sequence) -> bool:
        hits = self._cached_run(seq.hashes)
        reusable = sum(1 for h in seq.hashes[:hits] if h in self._evictable)
        needed = seq.blocks - hits
        if needed > self._empty + len(self._evictable) - reusable:
            return False
        for h in seq.hashes[:hits]:
            self._pin(h)
        self._take(needed)
        for h in seq.hashes[hits:]:  # the prompt's new full blocks, computed by its prefill
            if h in self._refs or h in self._evictable:  # cached after a gap: share it
                self._pin(h)
                self._empty += 1  # the block taken for it is not needed
            else:
                self._refs[h] = 1
        seq.pinned = list(seq.hashes)
        seq.anonymous = needed - (len(seq.hashes) - hits)  # the partial block, the answer's
        seq.cached_tokens = hits * self.spec.block_size
        self.prompt_tokens += len(seq.tokens)
        self.cached_tokens += seq.cached_tokens
        return True

    def _pin(self, h: int) -> None:
        if h in self._evictable:
            del self._evictable[h]
            self._refs[h] = 1
        else:
            self._refs[h] += 1

    def _take(self, blocks: int) -> None:
        from_empty = min(blocks, self._empty)
        self._empty -= from_empty
        for _ in range(blocks - from_empty):
            self._evictable.popitem(last=False)

    def _finish(self, seq: _Sequence) -> None:
        if seq in self._running:
            self._running.discard(seq)
            self.finished += 1
            if seq.final is not None:
                self._keep_answer(seq, seq.final)
            for h in reversed(seq.pinned):  # the tail is evicted first, as in vLLM
                left = self._refs[h] - 1
                if left:
                    self._refs[h] = left
                else:
                    del self._refs[h]
                    self._evictable[h] = None
            self._empty += seq.anonymous
        elif not seq.admitted.done():
            seq.admitted.cancel()  # still waiting: _schedule drops it
        self._schedule()

    def _keep_answer(self, seq: _Sequence, tokens: list[str]) -> None:
        """Name the answer's full blocks by their hashes, so they stay cached once released."""
        hashes = block_hashes(tokens, self.spec.block_size)[len(seq.hashes) :]
        for h in hashes[: seq.anonymous]:
            if h in self._refs or h in self._evictable:
                continue  # cached already; this sequence's copy is freed as anonymous
            self._refs[h] = 1
            seq.pinned.append(h)
            seq.anonymous -= 1

    def exposition(self, models: Sequence[str]) -> str:
        """vLLM's metrics for ``models`` (``engine="0"``), with vLLM's names and help."""
        lines: list[str] = []
        first = models[0] if models else ""
        label = f'engine="0",model_name="{_escape(first)}"'
        families = (
            ("vllm:num_requests_running", "gauge", _RUNNING_HELP, self.running),
            ("vllm:num_requests_waiting", "gauge", _WAITING_HELP, self.waiting),
            ("vllm:kv_cache_usage_perc", "gauge", _KV_HELP, self.kv_usage),
            ("vllm:prefix_cache_queries_total", "counter", _QUERIES_HELP, self.prompt_tokens),
            ("vllm:prefix_cache_hits_total", "counter", _HITS_HELP, self.cached_tokens),
            ("vllm:prompt_tokens_total", "counter", _PROMPT_HELP, self.prompt_tokens),
            ("vllm:generation_tokens_total", "counter", _GENERATED_HELP, self.generated_tokens),
        )
        for name, kind, text, value in families:
            lines += (f"# HELP {name} {text}", f"# TYPE {name} {kind}")
            lines.append(f"{name}{{{label}}} {float(value)!r}")
        running = sorted({s.model for s in self._running if s.model in self.spec.lora_adapters})
        waiting = sorted({s.model for s in self._waiting if s.model in self.spec.lora_adapters})
        name = "vllm:lora_requests_info"
        lines += (f"# HELP {name} Running stats on lora requests.", f"# TYPE {name} gauge")
        lines.append(
            f'{name}{{max_lora="{self.spec.max_loras}",'
            f'running_lora_adapters="{_escape(",".join(running))}",'
            f'waiting_lora_adapters="{_escape(",".join(waiting))}"}} {time.time()!r}'
        )
        lines.append(
            f'vllm:cache_config_info{{block_size="{self.spec.block_size}",'
            f'enable_prefix_caching="True",num_gpu_blocks="{self.spec.kv_blocks}"}} 1.0'
        )
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prompt_tokens(route_is_chat: bool, body: dict[str, Any]) -> list[str]:
    """The tokens an engine prefills for a request body (chat rendered, or the prompt's words)."""
    if route_is_chat:
        return chat_tokens(body.get("messages") or [])
    prompt = body.get("prompt")
    return prompt.split() if isinstance(prompt, str) else str(prompt).split()


def answer_length(spec: EngineSpec, body: dict[str, Any]) -> int:
    asked = body.get("max_tokens") or body.get("max_completion_tokens")
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
        return min(asked, spec.max_tokens * 8)
    return spec.max_tokens


async def serve(
    engine: Engine,
    request: web.Request,
    answer: Completion,
    body: dict[str, Any],
    headers: dict[str, str],
    stream: bool,
) -> web.StreamResponse:
    """Answer one chat or completion request with ``engine``'s timing: one chunk per token."""
    n = answer_length(engine.spec, body)
    answer = dataclasses.replace(answer, pieces=tuple(cut("".join(p), n) for p in answer.pieces))
    tokens = prompt_tokens(answer.kind == "chat", body)
    pieces = answer.pieces[0]
    try:
        run = engine.run(answer.model, tokens, len(pieces))
        async with run as active:
            if not stream:
                for _ in pieces:
                    await active.step()
                active.done(tokens + "".join(pieces).split())
                return web.Response(
                    body=answer.body(), content_type="application/json", headers=headers
                )
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            events = answer.stream(include_usage=include_usage)
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream; charset=utf-8", **headers}
            )
            await active.step()  # headers go out with the first token, as vLLM sends them
            await response.prepare(request)
            for event in events.head:
                await response.write(event)
            for index, event in enumerate(events.steps):
                if index:
                    await active.step()
                await response.write(event)
            active.done(tokens + "".join(pieces).split())
            for event in events.tail:
                await response.write(event)
            await response.write_eof()
            return response
    except EngineRefusedError as exc:
        return web.Response(
            status=400,
            body=error_body(str(exc), "invalid_request_error", "context_length_exceeded"),
            content_type="application/json",
            headers=headers,
        )


__all__ = ["ControlError", "Engine", "EngineRefusedError", "EngineSpec", "Run", "serve"]
