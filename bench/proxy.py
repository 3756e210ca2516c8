"""The proxy benchmark: gpugate against nginx and a bare uvicorn + aiohttp proxy, on loopback.

One run starts, each as its own process: a fake upstream (nginx answering canned OpenAI
responses), an nginx ``proxy_pass`` in front of it, the bare proxy (``bench/bare_proxy.py``),
gpugate, and two slow fake model servers (``gpugate.fleet``). It measures throughput (wrk),
added latency at a fixed rate (an open-loop client), time to first byte under 256 slow streams
and memory with 1,000 open streams, then prints the tables, the ratios and a Markdown summary
for BENCHMARKS.md. The machine is noisy: the ratios, measured in the same run, are the point.

    python bench/proxy.py [--duration 5] [--quick]

Exit status 1 when a target answered with errors or a phase could not finish.

This module parses the arguments and runs the phases; ``proxy_targets`` starts and stops what is
measured, ``proxy_load`` sends the load and times it, ``proxy_report`` holds the results and
prints the tables and the summary.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import uvloop
from proxy_load import (
    BODIES,
    MIXES,
    RATE,
    hold_streams,
    open_loop,
    pct,
    run_wrk,
    slow_streams,
)
from proxy_report import (
    Report,
    Settings,
    held_table,
    latency_table,
    print_summary,
    throughput_tables,
    ttfb_table,
)
from proxy_targets import (
    CHAT,
    LONG,
    PROXIES,
    SLOW,
    TARGETS,
    BenchError,
    Processes,
    Setup,
    cpu_s,
    rss_mb,
    serve_model,
    start_all,
)

# -- the phases ---------------------------------------------------------------------------------


def phase_throughput(setup: Setup, wrk: str, report: Report) -> None:
    duration = report.settings.duration
    print(f"\n== Throughput: wrk -t1 -c64 -d{duration}s --latency, POST ==", flush=True)
    for mix, (lane, path) in MIXES.items():
        for target in TARGETS:
            url, pid = setup.url(target, lane, path), setup.pids[target]
            if report.settings.warmup:
                run_wrk(wrk, url, BODIES[mix], 1, pid)
            load = run_wrk(wrk, url, BODIES[mix], duration, pid)
            report.loads.setdefault(mix, {})[target] = load
            if load.non_2xx or load.socket_errors:
                errors = f"{load.non_2xx} non-2xx and {load.socket_errors} socket errors"
                report.problems.append(f"{mix} via {target}: {errors} (wrk)")
    print(throughput_tables(report))


def phase_latency(setup: Setup, report: Report) -> None:
    duration = report.settings.duration
    print(f"\n== Added latency: open loop, chat at {RATE:g} req/s for {duration} s ==", flush=True)
    for target in TARGETS:
        url = setup.url(target, "json", CHAT)
        r = report.latency[target] = uvloop.run(open_loop(url, BODIES["chat"], RATE, duration))
        if r.errors:
            report.problems.append(f"latency via {target}: {r.errors} failed requests")
        if r.sent_rps < 0.95 * RATE or pct(r.late_ms, 99) > 5:
            report.problems.append(f"latency via {target}: the client could not keep the rate")
    print(latency_table(report))


def phase_ttfb(setup: Setup, report: Report) -> None:
    s = report.settings
    warmup_s = SLOW[0] * (SLOW[1] + 1) if s.warmup else 0.0
    delay_ms = SLOW[0] * 1000
    print(
        f"\n== Time to first byte: {s.ttfb_clients} concurrent slow streams ({SLOW[1]} chunks,"
        f" one per {delay_ms:g} ms) for {s.duration} s ==",
        flush=True,
    )
    for target in TARGETS:
        url, pid = setup.url(target, "slow", CHAT), setup.pids[target]
        cpu, wall = cpu_s(pid), time.monotonic()
        r = uvloop.run(slow_streams(url, BODIES["slow"], s.ttfb_clients, warmup_s, s.duration))
        report.ttfb_cpu[target] = (cpu_s(pid) - cpu) / (time.monotonic() - wall) * 100
        report.ttfb[target] = r
        if r.errors or not r.ttfb_ms:
            report.problems.append(f"slow streams via {target}: {r.errors} failed")
    print(ttfb_table(report))


def read_rss(setup: Setup, report: Report, moment: str) -> None:
    for target in PROXIES:
        report.rss.setdefault(target, {})[moment] = rss_mb(setup.pids[target])


def phase_held(setup: Setup, report: Report) -> None:
    count = report.settings.held
    print(
        f"\n== Memory: {count:,} long streams opened at once ({LONG[1]} chunks, one per"
        f" {LONG[0]:g} s) ==",
        flush=True,
    )
    stats_url = setup.url("direct", "long", "/_stats")
    for target in PROXIES:
        url, pid = setup.url(target, "long", CHAT), setup.pids[target]
        held = uvloop.run(hold_streams(url, BODIES["long"], count, partial(rss_mb, pid), stats_url))
        report.held[target], report.rss[target]["streams"] = held, held.rss_mb
        if held.opened != count:
            report.problems.append(f"long streams via {target}: {held.opened}/{count} opened")
        if held.left_open and target == "gpugate":
            report.problems.append(f"gpugate left {held.left_open} upstream streams open")
    print(held_table(report))


# -- the run ------------------------------------------------------------------------------------


def find_tool(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin")


def ensure_tools() -> tuple[str, str]:
    """The paths of wrk and nginx, installed with apt-get when missing."""
    missing = [
        pkg for tool, pkg in (("wrk", "wrk"), ("nginx", "nginx-light")) if not find_tool(tool)
    ]
    if missing:
        print(f"installing {' '.join(missing)} with apt-get", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", *missing]
        if subprocess.run(install, env=env, check=False).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, check=True)
            subprocess.run(install, env=env, check=True)
    wrk, nginx = find_tool("wrk"), find_tool("nginx")
    if wrk is None or nginx is None:
        raise BenchError("wrk and nginx are needed: apt-get install -y wrk nginx-light")
    return wrk, nginx


def machine(wrk: str, nginx: str) -> dict[str, str]:
    nginx_v = subprocess.run([nginx, "-v"], capture_output=True, text=True, check=False)
    wrk_v = subprocess.run([wrk, "-v"], capture_output=True, text=True, check=False)
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(len(os.sched_getaffinity(0))),
        "python": platform.python_version(),
        "nginx": nginx_v.stderr.strip().removeprefix("nginx version: nginx/"),
        "wrk": (wrk_v.stdout.splitlines() or ["wrk ?"])[0].split(" Copyright")[0],
        "kernel": platform.release(),
    }


def raise_fd_limit() -> None:
    """Enough descriptors for 1,000 streams through a proxy (the children inherit the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 16384 if hard == resource.RLIM_INFINITY else min(hard, 16384)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def run(settings: Settings) -> int:
    wrk, nginx = ensure_tools()
    raise_fd_limit()
    report = Report(machine(wrk, nginx), settings)
    print("== Machine ==\n" + "  ".join(f"{k}: {v}" for k, v in report.machine.items()))
    with tempfile.TemporaryDirectory(prefix="gpugate-bench-") as tmp, Processes(Path(tmp)) as procs:
        setup = start_all(procs, nginx)
        read_rss(setup, report, "idle")
        phase_throughput(setup, wrk, report)
        read_rss(setup, report, "loaded")
        phase_latency(setup, report)
        phase_ttfb(setup, report)
        phase_held(setup, report)
        procs.check()
    print_summary(report)
    if report.problems:
        print("\nFAILED:\n" + "\n".join(f"  - {p}" for p in report.problems), file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds per measured run (5)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 s runs, fewer streams")
    parser.add_argument("--model-server", nargs=4, help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args()
    if args.model_server:
        model, port, delay, chunks = args.model_server
        serve_model(model, int(port), float(delay), int(chunks))
        return 0
    if args.quick:
        settings = Settings(duration=1, warmup=False, ttfb_clients=64, held=100)
    else:
        settings = Settings(duration=args.duration, warmup=True, ttfb_clients=256, held=1000)
    try:
        return run(settings)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted; every process it started is stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
