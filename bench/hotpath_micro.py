"""Micro-measures of the hot path's pure parts, each beside today's way in the same run:

* the body's parse: gpugate's own ``web.bodies.json_document`` (``json.loads``, then a walk of
  every value for what no store can hold, measured in gpugate's venv), the stdlib's
  ``json.loads`` alone, ``orjson.loads`` and a ``msgspec`` decoder of only ``model`` and
  ``stream``, on three chat bodies (the bench's short one, an agent's turn with tools and
  history of ~8 KB, a long context of ~120 KB);
* a request's metrics (one counter, one histogram, labels cached as gpugate does):
  prometheus_client in memory (today), prometheus_client in multiprocess mode (each value an
  ``mmap``'d file, what ``/metrics`` across workers would need), and plain integers
  aggregated when scraped (``hotpath.CheapMetrics``);
* a scrape of two workers' metrics: prometheus_client's ``MultiProcessCollector`` reading the
  files, against an aggregator merging two workers' snapshots (JSON, as they would travel over a
  local socket) and rendering them.

    python bench/hotpath_micro.py        # re-runs itself with the candidates' venv

Medians of repeated timed loops; µs or ns per call.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent


def per_call(fn: Callable[[], object], *, seconds: float = 0.2, repeats: int = 7) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` loops of about ``seconds`` each."""
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds / 10:
        fn()
        n += 1
    loops = max(1, n * 10)
    results = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(loops):
            fn()
        results.append((time.perf_counter() - started) / loops)
    return statistics.median(results)


# -- bodies -------------------------------------------------------------------------------------


def bodies() -> dict[str, bytes]:
    from proxy_load import BODIES

    tool = {
        "type": "function",
        "function": {
            "name": "search_files",
            "description": "Search the repository for a pattern and return matching lines.",
            "parameters": {
                "type": "object",
                "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
                "required": ["pattern"],
            },
        },
    }
    history = []
    for i in range(12):
        history.append({"role": "user", "content": f"Step {i}: look for the config loader. " * 4})
        history.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i:04d}",
                        "type": "function",
                        "function": {"name": "search_files", "arguments": '{"pattern":"load"}'},
                    }
                ],
            }
        )
        history.append(
            {"role": "tool", "tool_call_id": f"call_{i:04d}", "content": "src/x.py:1: ok " * 8}
        )
    agent = {"model": "json-model", "messages": history, "tools": [tool] * 4, "stream": True}
    long_text = "The quick brown fox jumps over the lazy dog. " * 2600
    long = {"model": "json-model", "messages": [{"role": "user", "content": long_text}]}
    return {
        f"short ({len(BODIES['chat'])} B)": BODIES["chat"],
        f"agent turn ({len(json.dumps(agent)) // 1024} KB)": json.dumps(agent).encode(),
        f"long context ({len(json.dumps(long)) // 1024} KB)": json.dumps(long).encode(),
    }


def gpugate_parse_times() -> dict[str, float]:
    """Seconds per ``json_document`` of each body: gpugate's parse today (its venv only)."""
    from gpugate.web.bodies import json_document

    return {label: per_call(lambda b=body: json_document(b)) for label, body in bodies().items()}


def measure_parse(gpugate: dict[str, float]) -> None:
    from hotpath import PARSERS

    parsers = {name: make() for name, make in PARSERS.items()}
    print("== Parse model and stream from a chat body: µs per parse (ratio to gpugate's) ==")
    names = ["gpugate", *parsers]
    print(f"{'body':>24}  " + "  ".join(f"{name:>16}" for name in names))
    for label, body in bodies().items():
        times = {"gpugate": gpugate.get(label, math.nan)}
        times |= {name: per_call(lambda p=parse, b=body: p(b)) for name, parse in parsers.items()}
        cells = [f"{t * 1e6:8.2f} ({t / times['gpugate']:.2f})" for t in times.values()]
        print(f"{label:>24}  " + "  ".join(f"{c:>16}" for c in cells))


# -- metrics ------------------------------------------------------------------------------------


def record_cost(kind: str) -> float:
    """ns per request of ``kind`` metrics (``prom``, ``cheap``; multiprocess mode is ``prom``
    in a process that has PROMETHEUS_MULTIPROC_DIR set)."""
    from hotpath import METRICS

    metrics = METRICS[kind]()
    return per_call(lambda: metrics.record("json-model", "json-model", "interactive", "200", 0.003))


def child_record_cost(multiproc_dir: str) -> float:
    """The cost in a fresh process with multiprocess mode on (it is chosen at import)."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": multiproc_dir}
    code = "import hotpath_micro as m; print(m.record_cost('prom'))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return float(done.stdout.strip())


def measure_metrics() -> None:
    print("\n== A request's metrics (a counter and a histogram, labels cached) ==")
    with tempfile.TemporaryDirectory(prefix="gpugate-prom-") as mp:
        costs = {
            "prometheus_client, in memory (today)": record_cost("prom"),
            "prometheus_client, multiprocess mode (mmap files)": child_record_cost(mp),
            "plain integers, rendered when scraped": record_cost("cheap"),
        }
        base = costs["prometheus_client, in memory (today)"]
        for label, cost in costs.items():
            print(f"{label:>52}  {cost * 1e9:7.0f} ns  ({cost / base:.2f})")
        measure_scrape(mp)


def _fill_workers(mp: str, workers: int) -> None:
    """``workers`` processes each recording a spread of requests into ``mp``."""
    code = (
        "import hotpath as h; m = h.PromMetrics()\n"
        "for i in range(2000):\n"
        "    m.record(f'model-{i % 8}', f'up-{i % 4}', 'interactive', str(200 + i % 3), i / 1e4)"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": mp}
    for _ in range(workers):
        subprocess.run([sys.executable, "-c", code], env=env, check=True)


def measure_scrape(mp: str) -> None:
    from hotpath import CheapMetrics
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    workers = 2
    _fill_workers(mp, workers)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=mp)
    multiproc = per_call(lambda: generate_latest(registry), seconds=0.5, repeats=5)

    snapshots = []
    for _ in range(workers):
        m = CheapMetrics()
        for i in range(2000):
            m.record(f"model-{i % 8}", f"up-{i % 4}", "interactive", str(200 + i % 3), i / 1e4)
        snapshots.append(json.dumps(m.snapshot()))

    def aggregate() -> bytes:
        merged = CheapMetrics()
        for text in snapshots:
            doc = json.loads(text)
            for *key, n in doc["requests"]:
                k = tuple(key)
                merged._requests[k] = merged._requests.get(k, 0) + n  # noqa: SLF001
            for *key, row in doc["durations"]:
                k = tuple(key)
                have = merged._buckets.setdefault(k, [0.0] * len(row))  # noqa: SLF001
                for i, v in enumerate(row):
                    have[i] += v
        return merged.render()

    aggregated = per_call(aggregate, seconds=0.5, repeats=5)
    print(
        f"\n== One scrape of {workers} workers' request metrics (32 counter series,"
        " 8 histograms) =="
    )
    print(f"{'prometheus_client MultiProcessCollector (files)':>52}  {multiproc * 1e6:7.0f} µs")
    print(
        f"{'aggregator: merge JSON snapshots + render':>52}  {aggregated * 1e6:7.0f} µs"
        f"  ({aggregated / multiproc:.2f}; plus a local round trip per worker)"
    )


def main() -> int:
    from venvs import CANDIDATES, candidate_env

    here = Path(sys.prefix).resolve()
    if here != CANDIDATES.path.resolve():  # gpugate's venv: its parse, then the rest there
        env = {**candidate_env(), "GPUGATE_PARSE_S": json.dumps(gpugate_parse_times())}
        CANDIDATES.ensure()
        argv = [CANDIDATES.python, __file__, *sys.argv[1:]]
        return subprocess.run(argv, env=env, check=False).returncode
    measure_parse(json.loads(os.environ.get("GPUGATE_PARSE_S", "{}")))
    measure_metrics()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
