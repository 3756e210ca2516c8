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

import asyncio
import contextlib
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


# -- gpugate's own code per request, in process ------------------------------------------------


class _StubResponse:
    """An upstream's answer from memory: what the adapter's response offers the proxy."""

    __slots__ = ("_parts", "headers", "status")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], parts: list[bytes]) -> None:
        self.status, self.headers, self._parts = status, headers, parts

    async def read_chunk(self) -> bytes:
        return self._parts.pop(0) if self._parts else b""

    async def read_chunk_by(self, deadline: float) -> bytes:  # noqa: ARG002 - all there at once
        return self._parts.pop(0) if self._parts else b""

    def at_eof(self) -> bool:
        return not self._parts

    def set_idle_timeout(self, seconds: float | None) -> None:
        pass

    async def read(self) -> bytes:
        parts, self._parts = self._parts, []
        return b"".join(parts)

    def release(self) -> None:
        pass


Answer = tuple[list[tuple[bytes, bytes]], list[bytes]]  # the head, the body's pieces


def _stub_send(answer: list[Answer]) -> Any:
    """An adapter ``send`` answering every POST with ``answer[0]`` (set per case)."""

    async def send(
        method: str, _url: str, _headers: Any, _body: Any, _timeouts: Any, **_: Any
    ) -> Any:
        if method == "GET":
            return _StubResponse(200, [], [b"ok"])
        head, parts = answer[0]
        return _StubResponse(200, head, list(parts))

    return send


#: The answers measured: a chat completion; the bench's SSE stream in one piece (as its nginx
#: sends it) and event by event (as an engine does, one token each).
GATEWAY_MIXES = ("chat", "sse", "sse, 24 events")


def _gateway_yaml(workdir: str, policy: str, endpoints: int, keys: bool) -> str:
    urls = ", ".join(f"'http://127.0.0.1:{9 + i}'" for i in range(endpoints))  # never dialled
    limits = "max_inflight: 4096, max_queue: 10000"
    text = (
        f"listen: 127.0.0.1:1\nstore: sqlite:///{workdir}/micro.db\nupstreams:\n"
        f"  - {{id: json-model, urls: [{urls}], models: [json-model], {limits}"
        + ("" if policy == "none" else f", routing: {{policy: {policy}}}")
        + "}\n"
    )
    if keys:
        text += "auth: {mode: keys, bootstrap_keys_env: BENCH_KEYS}\n"
    return text


async def _gateway_costs(
    policy: str,
    endpoints: int,
    keys: bool,
    seconds: float,
    mixes: tuple[str, ...] = GATEWAY_MIXES,
    key_kinds: tuple[str, ...] = ("key", "key+limits"),
) -> dict[str, float]:
    """µs of CPU per request through gpugate's whole ASGI app (its middlewares, the data plane,
    the proxy, pick, admission, metrics, keys) with the upstream client replaced by answers
    from memory: everything gpugate does per request above the transport."""
    from proxy_keys import KEY_FREE, KEY_LIMITED, key_env
    from proxy_load import _request
    from proxy_targets import chat_completion, sse_stream

    from gpugate.config.loader import parse_config
    from gpugate.web.app import create_app
    from gpugate.wiring import build_gateway

    chat_head = [(b"content-type", b"application/json")]
    sse_head = [(b"content-type", b"text/event-stream")]
    sse = sse_stream()
    events = [e + b"\n\n" for e in sse.split(b"\n\n") if e]
    answers: dict[str, Answer] = {
        "chat": (chat_head, [chat_completion()]),
        "sse": (sse_head, [sse]),
        "sse, 24 events": (sse_head, events),
    }
    chat, stream = _request("json-model"), _request("json-model", stream=True)
    bodies = {"chat": chat, "sse": stream, "sse, 24 events": stream}
    answer = [answers["chat"]]
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="gpugate-micro-") as tmp:
        config = parse_config(_gateway_yaml(tmp, policy, endpoints, keys))
        environ = {**os.environ, **key_env()}
        async with build_gateway(
            config, environ=environ, probe_interval_s=3600, run_job_loops=False
        ) as gw:
            gw.proxy._client.send = _stub_send(answer)  # noqa: SLF001
            app = create_app(gw)
            kinds = {"key": KEY_FREE, "key+limits": KEY_LIMITED}
            keyed = tuple(kinds[k] for k in key_kinds) if keys else (None,)
            for key in keyed:
                for mix in mixes:
                    answer[0] = answers[mix]
                    label = {None: mix, KEY_FREE: f"{mix}, key", KEY_LIMITED: f"{mix}, key+limits"}
                    out[label[key]] = await _time_app(app, bodies[mix], key, seconds)
    return out


async def _time_app(app: Any, body: bytes, key: str | None, seconds: float) -> float:
    headers = [
        (b"host", b"127.0.0.1"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if key is not None:
        headers.append((b"authorization", b"Bearer " + key.encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 1),
        "state": {},
    }
    status: list[int] = []

    async def one() -> None:
        given = False
        gone = asyncio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        await app(dict(scope, state={}), receive, send)
        gone.set()

    for _ in range(200):  # warm: caches, the key's lookup, the leases
        await one()
    if any(s != 200 for s in status):
        raise RuntimeError(f"the in-process gateway answered {sorted(set(status))}")
    results = []
    for _ in range(7):  # the best of 7 loops: a shared machine's noise only ever adds
        n, cpu = 0, time.process_time()
        started = time.perf_counter()
        while time.perf_counter() - started < seconds / 7:
            for _ in range(50):
                await one()
            n += 50
        results.append((time.process_time() - cpu) / n)
    return min(results) * 1e6


def measure_gateway(seconds: float) -> dict[str, float]:
    import uvloop

    costs: dict[str, float] = {}
    for policy, endpoints, keys, tune, tag in (
        ("least_outstanding", 1, False, False, "1 endpoint, least_outstanding"),
        ("least_outstanding", 2, False, False, "2 endpoints, least_outstanding"),
        ("prefix_affinity", 2, False, False, "2 endpoints, prefix_affinity"),
        ("prefix_affinity", 2, True, False, "2 endpoints, prefix_affinity, auth keys"),
        ("prefix_affinity", 2, False, True, "2 endpoints, prefix_affinity, gc tuned"),
    ):
        with _gc_tuned(on=tune):
            for case, us in uvloop.run(_gateway_costs(policy, endpoints, keys, seconds)).items():
                costs[f"{tag}: {case}"] = us
    return costs


@contextlib.contextmanager
def _gc_tuned(*, on: bool) -> Iterator[None]:
    """``on``: the collector tuned as a server could be once started — what exists then frozen
    out of every collection (``gc.freeze``) and the youngest generation collected every 50,000
    allocations instead of 700 (a request of gpugate's leaves no cycles behind: nothing piles
    up for it to find)."""
    if os.environ.get("GPUGATE_MICRO_GC") == "off":  # for a profile: no collection at all,
        gc.disable()  # so none is sampled in whatever line happened to allocate
        yield
        gc.enable()
        return
    if not on:
        yield
        return
    was = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    try:
        yield
    finally:
        gc.set_threshold(*was)
        gc.unfreeze()


def main() -> int:
    from venvs import CANDIDATES, candidate_env

    if "--gateway-case" in sys.argv:  # one case, for bench/profile_proxy.py --in-process
        import uvloop

        policy, endpoints, auth, mix, seconds = sys.argv[sys.argv.index("--gateway-case") + 1 :]
        costs = uvloop.run(
            _gateway_costs(policy, int(endpoints), auth != "open", float(seconds), (mix,), (auth,))
        )
        print("US " + json.dumps(costs))
        return 0
    if "--gateway" in sys.argv:  # gpugate's venv (or PYTHONPATH=<another tree's src>)
        import gpugate

        print(f"== gpugate's own code per request, in process ({gpugate.__file__}) ==")
        costs = measure_gateway(float(os.environ.get("GPUGATE_MICRO_S", "2")))
        for label, us in costs.items():
            print(f"{label:>60}  {us:7.1f} µs")
        if "--json" in sys.argv:
            print("JSON " + json.dumps(costs))
        return 0

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
