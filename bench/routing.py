"""The routing benchmark: 4 simulated engines with real prefix caching behind gpugate, three
routing policies, two workloads, one run (issue #18).

One run starts two child processes: the fleet (4 ``gpugate.fleet`` engines, each with 8 sequence
slots, a FIFO queue, one prefill lane and a 16,384-token KV cache with prefix reuse and LRU
eviction) and a gateway (``gpugate serve``) with one upstream per policy, each over the same 4
engine URLs: model ``chat-lo`` routes ``least_outstanding`` (wave 1), ``chat-el``
``engine_load``, ``chat-pa`` ``prefix_affinity`` (both reading the engines' ``/metrics`` every
0.5 s). This process sends the load, streaming, and times the first token at the client.

Workloads, Poisson arrivals at 70 % of the fleet's capacity *with no cache hit* (each engine
prefills one prompt at a time: 1 / (prompt tokens x prefill time per token) per engine):

(a) shared-prefix chat: 16 system prompts of 2,000 tokens; 60 % of arrivals continue an idle
    conversation (up to 6 turns, its whole history sent back, answers included), the rest
    start one on a random system prompt;
(b) uniform random prompts of the same length: nothing to share.

Each policy runs each workload in interleaved rounds (A B C, then C B A, ...: machine noise
drifts over time, so no policy gets the quiet minutes), the engines' caches emptied before each
phase; the same seeds for every policy. Then each workload goes straight to one engine at a
quarter of the rate: the single-engine floor. Printed: mean, p50 and p99 TTFT, throughput
(requests and tokens per second), the engines' prefix-cache hit rate, each engine's share of
the requests, the ratios against ``least_outstanding`` and the issue's targets, and a Markdown
table for BENCHMARKS.md.

Time is scaled: prefill costs 40 us per uncached token and decode 4 ms per token (+5 % per
other running sequence), roughly 4x faster than a 7B model on an A10G, so a run takes a few
minutes.

    python bench/routing.py [--duration 20] [--rounds 2] [--quick]

Exit status 1 when a phase had errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import uvloop
from proxy_targets import BenchError, Processes, free_port, wait_http

ENGINES = 4
POLICIES = {"least_outstanding": "chat-lo", "engine_load": "chat-el", "prefix_affinity": "chat-pa"}
SHORT = {"least_outstanding": "LO", "engine_load": "EL", "prefix_affinity": "PA"}
SYSTEM_PROMPTS = 16
SYSTEM_TOKENS = 2000
USER_TOKENS = 40
MAX_TURNS = 6
CONTINUE_SHARE = 0.6
LOAD = 0.7
ENGINE = {  # EngineSpec fields, the scaled time model (see the docstring)
    "max_seqs": 8,
    "kv_blocks": 1024,
    "block_size": 16,
    "prefill_s_per_token": 40e-6,
    "decode_s_per_token": 4e-3,
    "batch_slowdown": 0.05,
    "max_tokens": 16,
}
DRAIN_S = 30.0


# -- the fleet (child process) ---------------------------------------------------------------


def serve_fleet(ports: list[int]) -> None:
    """4 engines on ``ports`` until killed: ``bench/routing.py --serve-fleet P1,P2,P3,P4``."""
    from gpugate.fleet import EngineSpec, ModelServer  # the child's only

    async def serve() -> None:
        servers = [
            ModelServer(list(POLICIES.values()), name=f"engine-{i}", engine=EngineSpec(**ENGINE))
            for i in range(len(ports))
        ]
        for server, port in zip(servers, ports, strict=True):
            await server.start("127.0.0.1", port)
        await asyncio.sleep(3600)  # killed long before; exits on its own if orphaned

    uvloop.run(serve())


def gateway_yaml(workdir: Path, port: int, engine_ports: list[int]) -> str:
    urls = ", ".join(f"'http://127.0.0.1:{p}'" for p in engine_ports)
    lines = [f"listen: 127.0.0.1:{port}", f"store: sqlite:///{workdir}/bench.db", "upstreams:"]
    for policy, model in POLICIES.items():
        engine = (
            ""
            if policy == "least_outstanding"
            else ", engine: {kind: vllm, poll_s: 0.5, staleness_s: 3}"
        )
        lines.append(
            f"  - {{id: {model}, urls: [{urls}], models: [{model}], max_inflight: 4096,"
            f" max_queue: 10000, routing: {{policy: {policy}}}{engine}}}"
        )
    return "\n".join(lines) + "\n"


# -- the workloads ---------------------------------------------------------------------------


def words(rng: random.Random, n: int, prefix: str) -> str:
    return " ".join(f"{prefix}{rng.randrange(50_000)}" for _ in range(n))


@dataclass
class Conversation:
    messages: list[dict[str, str]]
    turns: int = 0
    busy: bool = False


@dataclass
class Workload:
    """Where each arrival's messages come from, seeded."""

    shared: bool
    seed: int
    rng: random.Random = field(init=False)
    systems: list[str] = field(init=False)
    idle: list[Conversation] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.systems = [words(self.rng, SYSTEM_TOKENS, f"s{i}-") for i in range(SYSTEM_PROMPTS)]

    def next(self) -> Conversation:
        rng = self.rng
        user = {"role": "user", "content": words(rng, USER_TOKENS, "u")}
        if not self.shared:
            system = words(rng, SYSTEM_TOKENS, "r")
            return Conversation([{"role": "system", "content": system}, user])
        if self.idle and rng.random() < CONTINUE_SHARE:
            conversation = self.idle.pop(rng.randrange(len(self.idle)))
            conversation.messages.append(user)
            return conversation
        system = self.systems[rng.randrange(SYSTEM_PROMPTS)]
        return Conversation([{"role": "system", "content": system}, user])

    def done(self, conversation: Conversation, answer: str | None) -> None:
        conversation.turns += 1
        if self.shared and answer is not None and conversation.turns < MAX_TURNS:
            conversation.messages.append({"role": "assistant", "content": answer})
            self.idle.append(conversation)


def capacity_per_engine() -> float:
    """Requests per second one engine prefills with no cache hit (its bottleneck)."""
    tokens = SYSTEM_TOKENS + USER_TOKENS + 4
    return 1.0 / (tokens * ENGINE["prefill_s_per_token"])


# -- load ------------------------------------------------------------------------------------


@dataclass
class Phase:
    label: str
    ttft: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    tokens: int = 0
    served_by: Counter[str] = field(default_factory=Counter)
    elapsed_s: float = 0.0
    hit_rate: float | None = None

    def add(self, other: Phase) -> None:
        self.ttft += other.ttft
        self.errors += other.errors
        self.tokens += other.tokens
        self.served_by += other.served_by
        self.elapsed_s += other.elapsed_s


async def one_request(
    http: aiohttp.ClientSession, url: str, model: str, conversation: Conversation, phase: Phase
) -> str | None:
    body = {"model": model, "messages": conversation.messages, "stream": True}
    started = time.monotonic()
    first: float | None = None
    answer: list[str] = []
    try:
        async with http.post(url, json=body) as response:
            if response.status != 200:
                phase.errors[str(response.status)] += 1
                await response.read()
                return None
            phase.served_by[response.headers.get("X-Fleet-Server", "?")] += 1
            async for line in response.content:
                if not line.startswith(b"data: {"):
                    continue
                if first is None:
                    first = time.monotonic()
                for choice in json.loads(line[6:])["choices"]:
                    piece = choice.get("delta", {}).get("content")
                    if piece:
                        answer.append(piece)
                        phase.tokens += 1
    except (aiohttp.ClientError, TimeoutError) as exc:
        phase.errors[type(exc).__name__] += 1
        return None
    if first is None:
        phase.errors["no data"] += 1
        return None
    phase.ttft.append(first - started)
    return "".join(answer)


@dataclass(frozen=True)
class Target:
    """Where a phase sends its load, and how much."""

    url: str
    model: str
    rate: float
    duration_s: float
    warmup_s: float


async def run_phase(
    http: aiohttp.ClientSession, target: Target, workload: Workload, label: str
) -> Phase:
    """Poisson arrivals at the target's rate for its warm-up and duration, then wait (bounded)
    for the last ones. Requests sent during the warm-up fill the caches and are not counted."""
    phase = Phase(label)
    warming = Phase(label)
    arrivals = random.Random(workload.seed * 7919)
    tasks: set[asyncio.Task[None]] = set()

    async def send(conversation: Conversation, into: Phase) -> None:
        answer = await one_request(http, target.url, target.model, conversation, into)
        workload.done(conversation, answer)

    started = time.monotonic()
    at = started
    end = target.warmup_s + target.duration_s
    while True:
        at += arrivals.expovariate(target.rate)
        if at - started > end:
            break
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        into = phase if at - started >= target.warmup_s else warming
        task = asyncio.create_task(send(workload.next(), into))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=DRAIN_S)
        for task in late:
            task.cancel()
        phase.errors["unfinished"] += len(late)
    phase.errors += warming.errors
    phase.elapsed_s = time.monotonic() - started - target.warmup_s
    return phase


async def engine_counters(http: aiohttp.ClientSession, ports: list[int]) -> tuple[float, float]:
    hits = queries = 0.0
    for port in ports:
        async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
            for line in (await response.text()).splitlines():
                if line.startswith("vllm:prefix_cache_hits_total"):
                    hits += float(line.rsplit(" ", 1)[1])
                elif line.startswith("vllm:prefix_cache_queries_total"):
                    queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


async def reset(http: aiohttp.ClientSession, ports: list[int]) -> None:
    for port in ports:
        async with http.post(f"http://127.0.0.1:{port}/_control/reset") as response:
            response.raise_for_status()


async def measured(
    http: aiohttp.ClientSession, ports: list[int], target: Target, workload: Workload, label: str
) -> Phase:
    """One phase on emptied engines; the hit rate is the engines' over the whole phase."""
    await reset(http, ports)
    await asyncio.sleep(1.2)  # the gateway's engine readings catch up with the empty engines
    before = await engine_counters(http, ports)
    phase = await run_phase(http, target, workload, label)
    after = await engine_counters(http, ports)
    queries = after[1] - before[1]
    phase.hit_rate = (after[0] - before[0]) / queries if queries else None
    return phase


# -- report ----------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass(frozen=True)
class Row:
    label: str
    requests: int
    mean_ms: float
    p50_ms: float
    p99_ms: float
    rps: float
    tok_s: float
    hit_rate: float
    shares: str
    errors: int

    @classmethod
    def of(cls, phase: Phase, hits: list[float]) -> Row:
        served = sum(phase.served_by.values()) or 1
        shares = " ".join(
            f"{100 * phase.served_by[f'engine-{i}'] / served:.0f}" for i in range(ENGINES)
        )
        return cls(
            phase.label,
            len(phase.ttft),
            1000 * mean(phase.ttft),
            1000 * pct(phase.ttft, 0.5),
            1000 * pct(phase.ttft, 0.99),
            len(phase.ttft) / phase.elapsed_s if phase.elapsed_s else math.nan,
            phase.tokens / phase.elapsed_s if phase.elapsed_s else math.nan,
            mean(hits),
            shares,
            sum(phase.errors.values()),
        )


HEADER = (
    "| policy | requests | mean TTFT ms | p50 ms | p99 ms | req/s | tok/s | cache hit % "
    "| share per engine % | errors |"
)


def table(rows: list[Row]) -> list[str]:
    out = [HEADER, "|" + "---|" * 10]
    out += [
        f"| {r.label} | {r.requests} | {r.mean_ms:.0f} | {r.p50_ms:.0f} | {r.p99_ms:.0f} "
        f"| {r.rps:.1f} | {r.tok_s:.0f} | {100 * r.hit_rate:.0f} | {r.shares} | {r.errors} |"
        for r in rows
    ]
    return out


def verdicts(a: dict[str, Row], b: dict[str, Row]) -> list[str]:
    lo, pa = a["least_outstanding"], a["prefix_affinity"]
    blo, bpa = b["least_outstanding"], b["prefix_affinity"]
    mean_x, p99_x = lo.mean_ms / pa.mean_ms, lo.p99_ms / pa.p99_ms
    thr = pa.rps / lo.rps
    b_mean = bpa.mean_ms / blo.mean_ms - 1
    b_thr = bpa.rps / blo.rps - 1

    def ok(flag: bool) -> str:
        return "met" if flag else "NOT met"

    a_line = (
        f"(a) prefix_affinity vs least_outstanding: mean TTFT {mean_x:.1f}x lower "
        f"(target >= 3x: {ok(mean_x >= 3)}), p99 {p99_x:.1f}x lower (target >= 2x: "
        f"{ok(p99_x >= 2)}), throughput {thr:.3f}x (target >= 1 within noise: "
        f"{ok(thr >= 0.98)})"
    )
    b_line = (
        f"(b) prefix_affinity vs least_outstanding: mean TTFT {100 * b_mean:+.1f} %, "
        f"throughput {100 * b_thr:+.1f} % (target within 5 %: "
        f"{ok(b_mean <= 0.05 and b_thr >= -0.05)})"
    )
    return [a_line, b_line]


# -- main ------------------------------------------------------------------------------------


async def bench(args: argparse.Namespace, gateway: str, ports: list[int]) -> int:
    rate = LOAD * ENGINES * capacity_per_engine()
    print(
        f"engines: {ENGINES} x {ENGINE}; capacity with no cache hit {capacity_per_engine():.1f} "
        f"req/s each; offered {rate:.1f} req/s (70 %); {args.rounds} rounds of "
        f"{args.duration:g} s per policy and workload",
        flush=True,
    )
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    results: dict[str, dict[str, Row]] = {}
    failed = 0
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        for name, shared in (("a", True), ("b", False)):
            if args.only and args.only != name:
                continue
            totals = {p: Phase(p) for p in POLICIES}
            hits: dict[str, list[float]] = {p: [] for p in POLICIES}
            for r in range(args.rounds):
                order = list(POLICIES) if r % 2 == 0 else list(reversed(POLICIES))
                for policy in order:
                    target = Target(
                        f"{gateway}/v1/chat/completions", POLICIES[policy], rate,
                        args.duration, args.warmup,
                    )  # fmt: skip
                    workload = Workload(shared, seed=100 * r + (1 if shared else 2))
                    phase = await measured(http, ports, target, workload, policy)
                    print(
                        f"  ({name}) round {r + 1} {policy}: {len(phase.ttft)} requests, mean "
                        f"TTFT {1000 * mean(phase.ttft):.0f} ms, p99 "
                        f"{1000 * pct(phase.ttft, 0.99):.0f} ms, hit "
                        f"{100 * (phase.hit_rate or 0):.0f} %, errors {dict(phase.errors)}",
                        flush=True,
                    )
                    totals[policy].add(phase)
                    hits[policy].append(phase.hit_rate or 0.0)
            direct = Target(
                f"http://127.0.0.1:{ports[0]}/v1/chat/completions", "chat-lo", rate / ENGINES,
                args.duration, args.warmup,
            )  # fmt: skip
            workload = Workload(shared, seed=1 if shared else 2)
            floor = await measured(http, ports[:1], direct, workload, "one engine, direct (floor)")
            rows = {p: Row.of(totals[p], hits[p]) for p in POLICIES}
            results[name] = rows
            title = "shared-prefix chat" if shared else "uniform random prompts"
            print(f"\n({name}) {title}")
            for line in table([*rows.values(), Row.of(floor, [floor.hit_rate or 0.0])]):
                print(line)
            print(flush=True)
            failed += sum(r.errors for r in rows.values())
    if len(results) == 2:
        for line in verdicts(results["a"], results["b"]):
            print(line)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (ABC, CBA)")
    parser.add_argument(
        "--warmup", type=float, default=4.0, help="seconds of load before each phase counts"
    )
    parser.add_argument("--only", choices=["a", "b"], help="one workload only")
    parser.add_argument("--quick", action="store_true", help="6 s phases, 2 rounds")
    parser.add_argument("--serve-fleet", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fleet:
        serve_fleet([int(p) for p in args.serve_fleet.split(",")])
        return 0
    if args.quick:
        args.duration = 6.0
    with (
        tempfile.TemporaryDirectory(prefix="gpugate-routing-") as tmp,
        Processes(Path(tmp)) as procs,
    ):
        workdir = Path(tmp)
        ports = [free_port() for _ in range(ENGINES)]
        gateway_port = free_port()
        procs.start(
            "fleet",
            [sys.executable, __file__, "--serve-fleet", ",".join(map(str, ports))],
        )
        for port in ports:
            wait_http(procs, f"http://127.0.0.1:{port}/health")
        config = workdir / "gateway.yaml"
        config.write_text(gateway_yaml(workdir, gateway_port, ports))
        procs.start("gateway", [sys.executable, "-m", "gpugate", "serve", "--config", str(config)])
        gateway = f"http://127.0.0.1:{gateway_port}"
        wait_http(procs, f"{gateway}/readyz")
        try:
            return uvloop.run(bench(args, gateway, ports))
        except BenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            with urllib.request.urlopen(f"{gateway}/metrics", timeout=5) as response:
                picks = [
                    line
                    for line in response.read().decode().splitlines()
                    if line.startswith("gateway_routing_picks_total")
                ]
            print("\nrouting decisions:", *picks, sep="\n  ")


if __name__ == "__main__":
    sys.exit(main())
