"""``gpugate serve --workers 2`` against ``--workers 1``, in the same run, alternated.

    python bench/workers.py                 # ~2 min: 3 rounds of 5 s per target and phase
    python bench/workers.py --rounds 5 --duration 8
    python bench/workers.py --quick         # smoke test

The same fake upstream as ``bench/proxy.py`` (nginx answering a canned chat completion from
memory) serves both gateways (SQLite store, admission wide open, as ``proxy.py`` configures
``gpugate``). Each round measures, for each gateway in turn (so drift on a shared machine
hits both alike):

* **throughput**: ``wrk -t1 -c64`` POSTing a chat request for ``--duration`` s: req/s, p50/p99,
  and the CPU the gateway spent per request (supervisor and workers, read from /proc);
* **memory**: resident (RSS, pages shared after the fork counted in each process) and
  proportional (PSS, counted once) of the supervisor and its workers, after the load;
* **a scrape**: the median time of 50 ``/metrics`` scrapes, each on a fresh connection (with
  two workers the one that answers merges the other's snapshot);
* **paced bursts**: every 128 ms one chat request on each of 64 keep-alive connections at once
  (500 req/s; the last answer of a burst waits for the other 63): p50/p99 of the latency added
  against the fake upstream measured directly in the same round.

The cores: on this 2-core machine nothing is pinned — the gateway's workers, wrk (or the burst
client), nginx and the bench share CPUs 0-1, so a second worker competes with the load
generator for the second core. ``--pin`` instead puts the gateway on the last CPU alone and the
rest on the others: two workers on one core, which measures what the processes cost, not what
they gain. "busy": burst requests not sent because the connection still waited for the last
burst's answer (the gateway fell behind the pace). Exits 1 if any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from proxy_load import Load, paced_bursts, pct, run_wrk
from proxy_targets import (
    CHAT,
    LANES,
    BenchError,
    Cores,
    Processes,
    _start_nginx,
    fake_upstream_http,
    free_port,
    gateway_yaml,
    process_tree,
    rss_mb,
    wait_http,
)

BODY = b'{"model":"json-model","messages":[{"role":"user","content":"hi"}]}'
BURST_CONNS, BURST_RATE = 64, 500.0


@dataclass
class Target:
    name: str
    url: str
    pid: int
    loads: list[Load] = field(default_factory=list)
    added_p50: list[float] = field(default_factory=list)
    added_p99: list[float] = field(default_factory=list)
    errors: int = 0
    busy: int = 0  # burst requests not sent: the connection still had the last one's answer
    scrape_ms: float = 0.0


def _start_gateway(
    procs: Processes, cores: Cores, workdir: Path, workers: int, upstream: int
) -> Target:
    port = free_port()
    config = workdir / f"gw-{workers}.yaml"
    config.write_text(gateway_yaml(workdir, port, dict.fromkeys(LANES, upstream)))
    argv = [sys.executable, "-m", "gpugate", "serve", "--config", str(config)]
    argv += ["--workers", str(workers), "--no-access-log", "--log-level", "WARNING"]
    name = f"gpugate-x{workers}"
    pid = procs.start(name, cores.wrap(argv))
    url = f"http://127.0.0.1:{port}"
    wait_http(procs, url + "/readyz")
    return Target(name, url, pid)


def pss_mb(pid: int) -> float:
    """The proportional set size of ``pid`` and its children (pages shared after the fork
    count once in all), in MB: what a supervisor and its workers really hold."""
    total = 0
    for each in process_tree(pid):
        for line in Path(f"/proc/{each}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1])
    return total / 1024


def _scrapes(url: str, count: int = 50) -> float:
    """The median time of ``count`` scrapes of ``url`` (one at a time, a fresh connection each:
    with two workers, about half are answered by each and merge the other's snapshot)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    times = []
    for _ in range(count):
        began = time.perf_counter()
        with opener.open(url, timeout=10) as response:
            response.read()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def _bursts(url: str, duration: float) -> tuple[float, float, int, int]:
    result = asyncio.run(paced_bursts(url + CHAT, BODY, BURST_CONNS, BURST_RATE, duration))
    return pct(result.latency_ms, 50), pct(result.latency_ms, 99), result.errors, result.busy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=5, help="seconds per measured run")
    parser.add_argument("--pin", action="store_true", help="the gateway alone on the last CPU")
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s (a smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration = 1, 1
    cores = Cores.split(pin=args.pin)
    print(f"cores: {cores.describe()}")
    with (
        tempfile.TemporaryDirectory(prefix="gpugate-bench-workers-") as tmp,
        Processes(Path(tmp)) as procs,
    ):
        workdir = Path(tmp)
        json_port, sse_port = free_port(), free_port()
        http = fake_upstream_http(
            json_port, sse_port, free_port(), free_port()
        )  # one endpoint used
        _start_nginx(procs, "/usr/sbin/nginx", "direct", http, Cores.split(pin=False))
        wait_http(procs, f"http://127.0.0.1:{json_port}/health")
        direct = f"http://127.0.0.1:{json_port}"
        targets = [_start_gateway(procs, cores, workdir, n, json_port) for n in (1, 2)]
        for round_ in range(args.rounds):
            base50, base99, base_errors, _ = _bursts(direct, args.duration)
            if base_errors:
                raise BenchError(f"the fake upstream failed {base_errors} burst requests")
            order = targets if round_ % 2 == 0 else targets[::-1]
            for target in order:
                procs.check()
                load = run_wrk("wrk", target.url + CHAT, BODY, args.duration, target.pid)
                target.loads.append(load)
                target.errors += load.non_2xx + load.socket_errors
                p50, p99, errors, busy = _bursts(target.url, args.duration)
                target.added_p50.append(p50 - base50)
                target.added_p99.append(p99 - base99)
                target.errors += errors
                target.busy += busy
            one, two = targets
            a, b = one.loads[-1].rps, two.loads[-1].rps
            print(
                f"round {round_ + 1}: req/s x1 {a:,.0f}  x2 {b:,.0f} ({b / a:.2f}x);"
                f" added p99 in bursts x1 +{one.added_p99[-1]:.1f} ms"
                f"  x2 +{two.added_p99[-1]:.1f} ms (direct p99 {base99:.1f} ms)",
                flush=True,
            )
        for target in targets:
            target.scrape_ms = _scrapes(target.url + "/metrics")
        rss = {t.name: rss_mb(t.pid) for t in targets}
        pss = {t.name: pss_mb(t.pid) for t in targets}
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    _report(targets, rss, pss)
    return 1 if any(t.errors for t in targets) else 0


def _report(targets: list[Target], rss: dict[str, float], pss: dict[str, float]) -> None:
    print()
    print(
        "| gateway | chat req/s (each round) | p99 ms (wrk) | CPU µs/req"
        " | added p50 / p99 in bursts, ms | RSS / PSS after, MB | /metrics ms | errors | busy |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for t in targets:
        rps = " / ".join(f"{load.rps:,.0f}" for load in t.loads)
        p99 = " / ".join(f"{load.p99_ms:.1f}" for load in t.loads)
        cpu_us = " / ".join(f"{load.cpu_us:.0f}" for load in t.loads)
        pairs = zip(t.added_p50, t.added_p99, strict=True)
        added = ", ".join(f"+{a:.1f} / +{b:.1f}" for a, b in pairs)
        print(
            f"| {t.name} | {rps} | {p99} | {cpu_us} | {added} | {rss[t.name]:.0f} / "
            f"{pss[t.name]:.0f} | {t.scrape_ms:.1f} | {t.errors} | {t.busy} |"
        )
    one, two = targets
    ratios = [b.rps / a.rps for a, b in zip(one.loads, two.loads, strict=True)]
    print()
    print(
        "x2 / x1 chat req/s per round: "
        + ", ".join(f"{r:.2f}" for r in ratios)
        + f" (median {statistics.median(ratios):.2f})"
    )
    for what, values in (("p50", "added_p50"), ("p99", "added_p99")):
        a, b = (statistics.median(getattr(t, values)) for t in targets)
        print(f"added {what} in bursts, median of the rounds: x1 +{a:.1f} ms, x2 +{b:.1f} ms")


if __name__ == "__main__":
    raise SystemExit(main())
