"""What routing costs the proxy per request, in process (``bench/proxy.py`` prints it beside the
throughput of gpugate with each picker): the picker alone, in microseconds of CPU, for wave 1's
power of two choices and for each routing policy over 4 endpoints with fresh engine readings; the
prefix hashing alone; and the memory of the prefix index and the session table per 10,000
conversations.

    python bench/routing_cost.py [--against REV]

``--against REV`` (e.g. ``main~1``) also times the picker of that git revision in the same process
(its ``core/scoring.py`` and ``core/prefix_index.py`` loaded from git) and prints the ratios.
"""

from __future__ import annotations

import argparse
import gc
import random
import subprocess
import sys
import time
import tracemalloc
import types
from collections.abc import Callable
from typing import Any

from gpugate.config import RoutingConfig
from gpugate.core import picking
from gpugate.core.engine_metrics import EngineReading, EngineSignal
from gpugate.core.picking import EndpointState
from gpugate.core.prefix_index import PrefixIndex
from gpugate.core.scoring import Router

ENDPOINTS = 4
SYSTEM_WORDS = 2000  # ~12 KB of chat: the routing benchmark's shared system prompt
REPEAT = 20_000


def chat(rng: random.Random, system: str, turns: int) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}]
    for turn in range(turns):
        messages.append(
            {"role": "user", "content": " ".join(f"u{rng.randrange(9999)}" for _ in range(40))}
        )
        if turn < turns - 1:
            messages.append({"role": "assistant", "content": f"answer {turn} " * 8})
    return {"model": "m", "messages": messages, "user": f"user-{rng.randrange(10**9)}"}


def per_call_us(fn: Callable[[], object], repeat: int = REPEAT) -> float:
    """The best of 5 runs of ``repeat`` calls, in microseconds per call (CPU noise only adds)."""
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(repeat):
            fn()
        best = min(best, time.process_time() - started)
    return best / repeat * 1e6


def picker_costs(
    router_class: type[Router] = Router, index_class: type[PrefixIndex] = PrefixIndex
) -> list[tuple[str, float]]:
    """(what, microseconds per request) for each picker on one 2,000-token chat request."""
    rng = random.Random(1)
    endpoints = [EndpointState("u", f"http://10.0.0.{i}:8000") for i in range(ENDPOINTS)]
    reading = EngineReading("vllm", 3.0, 1.0, 0.5, 0.8)
    signals = {ep.url: EngineSignal(reading, 2, 0.5) for ep in endpoints}
    doc = chat(rng, " ".join(f"s{i}" for i in range(SYSTEM_WORDS)), turns=3)
    rows = [("least_outstanding (wave 1: picking.pick)",
             per_call_us(lambda: picking.pick(endpoints, rng, 0.0)))]  # fmt: skip
    for policy in ("least_outstanding", "engine_load", "prefix_affinity"):
        cfg = RoutingConfig(policy=policy)  # type: ignore[arg-type]
        router = router_class(lambda _m, _u, c=cfg: c, signal=lambda _u, url, _n: signals[url])

        def one(router: Router = router) -> None:
            route = router.route("m", None, doc, ())
            chosen, _ = router.pick(route, endpoints, rng, 0.0)
            router.sent(route, chosen)

        rows.append((f"Router, {policy} (route + pick + sent)", per_call_us(one, REPEAT // 4)))
    index = index_class()
    rows.append(("of which prefix hashing (~12 KB chat)", per_call_us(lambda: index.hashes(doc))))
    return rows


def memory_per_10k() -> list[tuple[str, int, float]]:
    """(conversations, blocks kept, MB) after routing 10,000 four-turn conversations: on 16
    shared system prompts, and each on a system prompt of its own (the worst case)."""
    out = []
    for label, shared in (
        ("16 shared 2,000-token system prompts", True),
        ("unique prompts", False),
    ):
        rng = random.Random(2)
        systems = [" ".join(f"s{k}-{i}" for i in range(SYSTEM_WORDS)) for k in range(16)]
        cfg = RoutingConfig(prefix_max_blocks=10_000_000)
        endpoints = [EndpointState("u", f"http://10.0.0.{i}:8000") for i in range(ENDPOINTS)]
        gc.collect()
        tracemalloc.start()
        router = Router(lambda _m, _u, c=cfg: c)
        for n in range(10_000):
            system = systems[n % 16] if shared else f"conversation {n} " + systems[0]
            for turns in range(1, 5):
                route = router.route("m", None, chat(random.Random(n), system, turns), ())
                chosen, _ = router.pick(route, endpoints, rng, 0.0)
                router.sent(route, chosen)
        size, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        blocks = int(repr(router).split("blocks=")[1].split()[0])
        out.append((label, blocks, size / 2**20))
    return out


def old_module(rev: str, name: str, **names: Any) -> types.ModuleType:
    """``gpugate/core/<name>.py`` as of git ``rev``, as a module, with ``names`` set in it."""
    source = subprocess.run(
        ["git", "show", f"{rev}:src/gpugate/core/{name}.py"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    module = types.ModuleType(f"{name}_at_{rev}")
    sys.modules[module.__name__] = module  # dataclasses and typing look the module up
    exec(compile(source, f"{rev}:{name}.py", "exec"), module.__dict__)
    module.__dict__.update(names)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="REV", help="also time this revision's prefix index")
    args = parser.parse_args()
    print("== Routing cost per request (CPU, best of 5) ==")
    rows = picker_costs()
    if args.against:
        index_then = old_module(args.against, "prefix_index").PrefixIndex
        router_then = old_module(args.against, "scoring", PrefixIndex=index_then).Router
        baseline = dict(picker_costs(router_then, index_then))
        print(f"  {'':<50} {'now':>8}    {args.against:>8}    ratio")
        for what, us in rows:
            was = baseline[what]
            print(f"  {what:<50} {us:8.1f} us {was:8.1f} us {us / was:6.2f}x")
    else:
        for what, us in rows:
            print(f"  {what:<50} {us:8.1f} us")
    print("== Prefix index and sessions per 10,000 conversations (4 turns each) ==")
    for label, blocks, mb in memory_per_10k():
        print(f"  {label:<40} {blocks:>9,} blocks {mb:8.1f} MB")


if __name__ == "__main__":
    main()
