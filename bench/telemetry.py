"""The cost of tracing (issue #19): gpugate with OpenTelemetry off, on (every trace recorded and
exported over OTLP/HTTP) and on at ``sample_ratio: 0``, same run, same load.

    python bench/telemetry.py                 # ~1 min: 3 variants x 2 rounds x 2 bodies x 5 s
    python bench/telemetry.py --duration 2    # shorter
    mkdir -p /tmp/b && git archive main | tar -x -C /tmp/b
    python bench/telemetry.py --baseline /tmp/b   # + the gateway of that tree, tracing off

Each variant is a ``gpugate serve`` process (SQLite store, admission wide open) in front of one
fake upstream process answering canned OpenAI responses from memory (a ~600-byte chat
completion and a 23-event SSE stream: ``proxy_targets.chat_completion``/``sse_stream``), and,
for tracing, an OTLP/HTTP receiver process that decodes every export (``opentelemetry-proto``)
and counts the spans. The load is 16 closed-loop aiohttp clients for ``--duration`` seconds per
body; the variants are interleaved round by round so the machine's drift hits all alike.

Printed per variant and body: requests/s, p50/p99 latency, and the gateway's CPU per request
(user + system of its process, the exporter's thread included) — the figure that does not
depend on how busy the other cores are — and each one's ratio to ``off`` measured in the same
round; then the spans the receiver got.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
from aiohttp import web
from proxy_targets import (
    Processes,
    chat_completion,
    cpu_s,
    free_port,
    sse_stream,
    wait_http,
)

CLIENTS = 16
VARIANTS = ("off", "on", "sampled-out")
BODIES = {
    "chat": b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
    "stream": b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}',
}
HERE = Path(__file__).resolve().parent


# -- the child processes ------------------------------------------------------------------------


def serve_upstream(port: int) -> None:
    chat, stream = chat_completion(), sse_stream()

    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if b'"stream":true' in body:
            return web.Response(body=stream, content_type="text/event-stream")
        return web.Response(body=chat, content_type="application/json")

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def serve_receiver(port: int) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    spans = 0

    async def traces(request: web.Request) -> web.Response:
        nonlocal spans
        export = ExportTraceServiceRequest.FromString(await request.read())
        spans += sum(len(ss.spans) for rs in export.resource_spans for ss in rs.scope_spans)
        answer = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type="application/x-protobuf")

    async def count(_: web.Request) -> web.Response:
        return web.json_response({"spans": spans})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    app.router.add_get("/health", count)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def gateway_yaml(workdir: Path, port: int, upstream: int, variant: str, receiver: int) -> str:
    lines = [
        f"listen: 127.0.0.1:{port}",
        f"store: sqlite:///{workdir}/{variant}.db",
        "upstreams:",
        (
            f"  - {{id: m, url: 'http://127.0.0.1:{upstream}', models: [m],"
            " max_inflight: 4096, max_queue: 10000}"
        ),
        "server: {access_log: false}",
    ]
    if variant in ("on", "sampled-out"):
        ratio = 1.0 if variant == "on" else 0.0
        lines.append(
            f"telemetry: {{otlp_endpoint: 'http://127.0.0.1:{receiver}', sample_ratio: {ratio}}}"
        )
    return "\n".join(lines) + "\n"


# -- the load -----------------------------------------------------------------------------------


async def load(url: str, body: bytes, seconds: float) -> list[float]:
    """Closed-loop clients for ``seconds``: each request's latency (whole body read)."""
    latencies: list[float] = []
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=CLIENTS)
    async with aiohttp.ClientSession(connector=connector) as http:
        deadline = time.monotonic() + seconds

        async def client() -> None:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                async with http.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise SystemExit(f"{url} answered {resp.status}")
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return latencies


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run (5)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every variant (2)")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="also run the gateway from this source tree (its src/), tracing off: the cost of "
        "the hooks themselves, e.g. a `git archive main` of the commit before them",
    )
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)  # a child process
    parser.add_argument("--receiver", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upstream:
        serve_upstream(args.upstream)
        return 0
    if args.receiver:
        serve_receiver(args.receiver)
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="gpugate-bench-telemetry-"))
    me = [sys.executable, str(Path(__file__).resolve())]
    gpugate = str(Path(sys.executable).with_name("gpugate"))
    upstream, receiver = free_port(), free_port()
    variants = [*(["baseline"] if args.baseline else []), *VARIANTS]
    ports = {v: free_port() for v in variants}
    results: dict[tuple[str, str], list[tuple[float, float, float, float]]] = {}
    with Processes(workdir) as procs:
        procs.start("upstream", [*me, "--upstream", str(upstream)])
        procs.start("receiver", [*me, "--receiver", str(receiver)])
        wait_http(procs, f"http://127.0.0.1:{upstream}/health")
        wait_http(procs, f"http://127.0.0.1:{receiver}/health")
        pids = {}
        for v in variants:
            config = workdir / f"{v}.yaml"
            config.write_text(gateway_yaml(workdir, ports[v], upstream, v, receiver))
            env = None
            if v == "baseline":
                env = {**os.environ, "PYTHONPATH": str(args.baseline.resolve() / "src")}
            pids[v] = procs.start(v, [gpugate, "serve", "--config", str(config)], env=env)
            wait_http(procs, f"http://127.0.0.1:{ports[v]}/healthz")
        for _ in range(args.rounds):
            for name, body in BODIES.items():
                for v in variants:
                    url = f"http://127.0.0.1:{ports[v]}/v1/chat/completions"
                    asyncio.run(load(url, body, 0.5))  # warm the pools
                    before = cpu_s(pids[v])
                    latencies = asyncio.run(load(url, body, args.duration))
                    spent = cpu_s(pids[v]) - before
                    n = len(latencies)
                    row = (n / args.duration, pct(latencies, 50), pct(latencies, 99), spent / n)
                    results.setdefault((name, v), []).append(row)
        time.sleep(6)  # the batch processor exports every 5 s
        spans = spans_received(f"http://127.0.0.1:{receiver}/health")
    report(results, variants, spans)
    return 0


def spans_received(url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no HTTP_PROXY
    with opener.open(url, timeout=5) as resp:
        return int(json.loads(resp.read())["spans"])


def report(
    results: dict[tuple[str, str], list[tuple[float, float, float, float]]],
    variants: list[str],
    spans: int,
) -> None:
    base_name = variants[0]
    print(f"{CLIENTS} closed-loop clients; medians over rounds; ratios to `{base_name}`, same run")
    head = ("body", "variant", "req/s", "p50 ms", "p99 ms", "CPU us/req", "CPU ratio")
    print("{:7} {:12} {:>8} {:>8} {:>8} {:>11} {:>9}".format(*head))
    for name in BODIES:
        base = statistics.median(r[3] for r in results[name, base_name])
        for v in variants:
            rows = results[name, v]
            rps = statistics.median(r[0] for r in rows)
            p50 = statistics.median(r[1] for r in rows) * 1000
            p99 = statistics.median(r[2] for r in rows) * 1000
            cpu = statistics.median(r[3] for r in rows)
            cells = (name, v, rps, p50, p99, cpu * 1e6, cpu / base)
            print("{:7} {:12} {:8.0f} {:8.2f} {:8.2f} {:11.0f} {:9.2f}".format(*cells))
    print(f"spans received by the OTLP receiver: {spans}")


if __name__ == "__main__":
    raise SystemExit(main())
