"""The proxy benchmark: gpugate against nginx, vLLM's Rust router and a bare uvicorn + aiohttp
proxy, and (``--candidates``) the hot-path prototypes, one core each, on loopback.

One run starts, each as its own process: a fake upstream (nginx answering canned OpenAI
responses), an nginx ``proxy_pass`` in front of it, ``vllm-router`` (from PyPI, installed into
its own venv under ``~/.cache/gpugate-bench/``; round robin to the same upstream), the bare
proxy (``bench/bare_proxy.py``), gpugate, the prototypes when asked, and two slow fake model
servers (``gpugate.fleet``). Each proxy is pinned to a core of its own and the load generator
and the fake upstreams to the others (``--no-pin`` to let them float); the output says how the
cores were split. It measures throughput (wrk), latency added by paced bursts (64 requests
written at once, ~500 req/s) and by an open loop at the same rate, time to first byte under 256
slow streams and memory with 1,000 open streams, then prints the tables, the multiples of the
router and of the bare proxy, the targets of issue #21 and a Markdown summary for
BENCHMARKS.md. The machine is noisy: the ratios, measured in the same run, are the point.

    python bench/proxy.py [--duration 5] [--quick] [--candidates] [--targets a,b,...] [--no-pin]

Exit status 1 when a target answered with errors or a phase could not finish.

This module parses the arguments and runs the phases; ``proxy_targets`` starts and stops what is
measured, ``proxy_load`` sends the load and times it, ``proxy_report`` holds the results and
prints the tables and the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import uvloop
from proxy_baseline import baseline_python, resolve
from proxy_keys import phase_keys
from proxy_load import (
    BODIES,
    BURST,
    MIXES,
    RATE,
    hold_streams,
    open_loop,
    paced_bursts,
    pct,
    run_wrk,
    run_wrk_at_once,
    slow_streams,
)
from proxy_report import (
    Report,
    Settings,
    bursts_table,
    held_table,
    latency_table,
    print_summary,
    throughput_tables,
    ttfb_table,
)
from proxy_targets import (
    BASELINE,
    CHAT,
    LONG,
    ONE_CORE,
    OPTIONAL,
    PROTOTYPES,
    SLOW,
    TARGETS,
    WORKERS_RUN,
    BenchError,
    Cores,
    Processes,
    Setup,
    Tools,
    cpu_s,
    free_port,
    gateway_yaml,
    process_tree,
    rss_mb,
    serve_model,
    start_all,
    wait_http,
)
from routing_cost import memory_per_10k, picker_costs
from venvs import CANDIDATES, VLLM_ROUTER, VenvError, candidate_env

# -- the phases ---------------------------------------------------------------------------------


def phase_throughput(setup: Setup, wrk: str, report: Report) -> None:
    duration = report.settings.duration
    print(f"\n== Throughput: wrk -t1 -c64 -d{duration}s --latency, POST ==", flush=True)
    for mix, (lane, path) in MIXES.items():
        for target in setup.targets:
            url, pid = setup.url(target, lane, path), setup.pid(target, lane)
            if report.settings.warmup:
                run_wrk(wrk, url, BODIES[mix], 1, pid)
            load = run_wrk(wrk, url, BODIES[mix], duration, pid)
            report.loads.setdefault(mix, {})[target] = load
            if load.non_2xx or load.socket_errors:
                errors = f"{load.non_2xx} non-2xx and {load.socket_errors} socket errors"
                report.problems.append(f"{mix} via {target}: {errors} (wrk)")
    print(throughput_tables(report))


def phase_bursts(setup: Setup, report: Report) -> None:
    duration = report.settings.duration
    print(
        f"\n== Added latency: paced bursts, {BURST} chat requests written at once on {BURST}"
        f" keep-alive connections every {BURST / RATE * 1000:g} ms ({RATE:g} req/s) for"
        f" {duration} s ==",
        flush=True,
    )
    for target in setup.targets:
        url, pid = setup.url(target, "json", CHAT), setup.pid(target)
        cpu = cpu_s(pid)
        b = uvloop.run(paced_bursts(url, BODIES["chat"], BURST, RATE, duration))
        report.bursts[target] = b
        report.bursts_cpu_us[target] = (cpu_s(pid) - cpu) / max(b.sent, 1) * 1e6
        if b.errors:
            report.problems.append(f"bursts via {target}: {b.errors} failed requests")
        if pct(b.late_ms, 99) > 5:
            report.problems.append(f"bursts via {target}: the client could not keep the pace")
    print(bursts_table(report))


def phase_latency(setup: Setup, report: Report) -> None:
    duration = report.settings.duration
    print(f"\n== Added latency: open loop, chat at {RATE:g} req/s for {duration} s ==", flush=True)
    for target in setup.targets:
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
    for target in setup.targets:
        url, pid = setup.url(target, "slow", CHAT), setup.pid(target, "slow")
        cpu, wall = cpu_s(pid), time.monotonic()
        r = uvloop.run(slow_streams(url, BODIES["slow"], s.ttfb_clients, warmup_s, s.duration))
        report.ttfb_cpu[target] = (cpu_s(pid) - cpu) / (time.monotonic() - wall) * 100
        report.ttfb[target] = r
        if r.errors or not r.ttfb_ms:
            report.problems.append(f"slow streams via {target}: {r.errors} failed")
    print(ttfb_table(report))


ROUTING_ROUNDS = 5  # rounds of both at once per mix


def phase_routing_rps(setup: Setup, wrk: str, report: Report) -> None:
    """gpugate with the default routing against gpugate with wave 1's picker, **loaded at the
    same time** (:func:`~proxy_load.run_wrk_at_once`: both pinned to the proxies' core, each
    by its own wrk, so a request's cost is compared in one window and the machine's noise falls
    on both alike; pairs run one after the other measured 0.77-0.97x in one run whose own
    throughput table said 0.99x); per mix, the median of the rounds' req/s and CPU ratios."""
    pair = ("gpugate", "gpugate-p2c")
    if not all(t in setup.targets for t in pair):
        return
    duration = max(1, report.settings.duration // 2)
    print(f"\n== Routing: {pair[0]} / {pair[1]}, {ROUTING_ROUNDS} rounds of {duration} s"
          " wrk -c64 against each at once, sharing the proxies' core ==")  # fmt: skip
    for mix in ("chat", "sse"):
        lane, path = MIXES[mix]
        both = [(setup.url(t, lane, path), setup.pid(t, lane), None) for t in pair]
        rps_ratios, cpu_ratios = [], []
        for _ in range(ROUTING_ROUNDS):
            a, b = run_wrk_at_once(wrk, BODIES[mix], duration, *both)
            rps_ratios.append(a.rps / b.rps)
            cpu_ratios.append(a.cpu_us / b.cpu_us)
            for target, got in zip(pair, (a, b), strict=True):
                if got.non_2xx or got.socket_errors:
                    report.problems.append(
                        f"routing {mix} via {target}: {got.non_2xx} non-2xx,"
                        f" {got.socket_errors} socket errors"
                    )
        spread = " ".join(f"{r:.2f}" for r in sorted(rps_ratios))
        report.routing[mix] = statistics.median(rps_ratios)
        print(
            f"  {mix:<5} req/s ratio median {statistics.median(rps_ratios):.3f} (rounds: {spread}),"
            f" CPU/req ratio median {statistics.median(cpu_ratios):.3f}"
        )


def phase_picker(report: Report) -> None:
    """The picker's CPU per request in process (issue #18): wave 1's beside each policy's; the
    throughput tables compare gpugate (prefix_affinity, the default) with gpugate-p2c."""
    print("\n== Routing: the picker's CPU per request, 4 endpoints, a 2,000-token chat ==")
    costs = picker_costs()
    base = costs[0][1]
    for what, us in costs:
        print(f"  {what:<50} {us:7.1f} us  ({us / base:5.1f}x wave 1)")
        if what.startswith("Router, "):
            report.picker_us[what.split(",")[1].split("(")[0].strip()] = us
    print("  prefix index + sessions per 10,000 four-turn conversations:")
    for label, blocks, mb in memory_per_10k():
        print(f"    {label:<40} {blocks:>9,} blocks {mb:7.1f} MB")


WORKER_PAIRS = 4  # alternated pairs of wrk runs, one worker against two


def serve_has_workers() -> bool:
    """Whether this tree's ``gpugate serve`` takes ``--workers`` (another branch adds it)."""
    done = subprocess.run(
        [sys.executable, "-m", "gpugate", "serve", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    return "--workers" in done.stdout


def phase_workers(setup: Setup, wrk: str, procs: Processes, report: Report) -> None:
    """``gpugate serve --workers 2`` against the run's one-worker gpugate (issue #21 done-when
    2): both on every core for this phase (a pinned proxy has one core: nothing to gain), wrk
    and the fake upstream beside them, in alternated pairs; the one-worker gpugate goes back to
    its core afterwards."""
    if "gpugate" not in setup.targets or not serve_has_workers():
        print("\n== Workers: skipped (gpugate serve --help lists no --workers) ==")
        return
    every = frozenset(os.sched_getaffinity(0)) | setup.cores.proxy
    port = free_port()
    config = procs.workdir / "gpugate-x2.yaml"
    config.write_text(gateway_yaml(procs.workdir, port, setup.ports["direct"]))
    serve = ["serve", "--config", str(config), "--log-level", "WARNING", "--workers", "2"]
    x2 = procs.start("gpugate-x2", [sys.executable, "-m", "gpugate", *serve])
    wait_http(procs, f"http://127.0.0.1:{port}/readyz", timeout_s=60)
    one = setup.pid("gpugate")
    _set_affinity(one, every)
    _set_affinity(x2, every)  # started from this process, pinned to the load's cores: not both
    os.sched_setaffinity(0, every)
    duration = max(1, report.settings.duration // 2)
    print(
        f"\n== Workers: gpugate --workers 2 / one worker, both on CPUs {sorted(every)} with wrk"
        f" and the fake upstream, {WORKER_PAIRS} alternated pairs of {duration} s =="
    )
    try:
        for mix in ("chat", "sse"):
            lane, path = MIXES[mix]
            ratios = []
            for k in range(WORKER_PAIRS):
                runs = {"one": (setup.url("gpugate", lane, path), one),
                        "two": (f"http://127.0.0.1:{port}{path}", x2)}  # fmt: skip
                loads = {}
                for name in ("one", "two") if k % 2 == 0 else ("two", "one"):
                    url, pid = runs[name]
                    loads[name] = run_wrk(wrk, url, BODIES[mix], duration, pid)
                    if loads[name].non_2xx or loads[name].socket_errors:
                        report.problems.append(f"{mix} via gpugate workers={name}: errors (wrk)")
                ratios.append(loads["two"].rps / loads["one"].rps)
            report.workers[mix] = statistics.median(ratios)
            spread = " ".join(f"{r:.2f}" for r in sorted(ratios))
            print(f"  {mix:<5} req/s two / one median {report.workers[mix]:.3f} (pairs: {spread})")
    finally:
        _set_affinity(one, setup.cores.proxy)
        os.sched_setaffinity(0, setup.cores.load)


def _set_affinity(pid: int, cpus: frozenset[int]) -> None:
    for each in process_tree(pid):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(each, cpus)


def read_rss(setup: Setup, report: Report, moment: str) -> None:
    for target in setup.proxies:  # the router's: its chat lane's process
        report.rss.setdefault(target, {})[moment] = rss_mb(setup.pid(target))


def phase_held(setup: Setup, report: Report) -> None:
    count = report.settings.held
    print(
        f"\n== Memory: {count:,} long streams opened at once ({LONG[1]} chunks, one per"
        f" {LONG[0]:g} s) ==",
        flush=True,
    )
    stats_url = setup.url("direct", "long", "/_stats")
    for target in setup.proxies:
        url, pid = setup.url(target, "long", CHAT), setup.pid(target, "long")
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


def machine(wrk: str, nginx: str, tools: Tools) -> dict[str, str]:
    nginx_v = subprocess.run([nginx, "-v"], capture_output=True, text=True, check=False)
    wrk_v = subprocess.run([wrk, "-v"], capture_output=True, text=True, check=False)
    more = {}
    if tools.vllm_router is not None:
        more["vllm-router"] = VLLM_ROUTER.pins[0].partition("==")[2]
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(len(os.sched_getaffinity(0))),
        "python": platform.python_version(),
        "nginx": nginx_v.stderr.strip().removeprefix("nginx version: nginx/"),
        "wrk": (wrk_v.stdout.splitlines() or ["wrk ?"])[0].split(" Copyright")[0],
        "kernel": platform.release(),
        **more,
    }


def raise_fd_limit() -> None:
    """Enough descriptors for 1,000 streams through a proxy (the children inherit the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 16384 if hard == resource.RLIM_INFINITY else min(hard, 16384)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def ensure_venvs(targets: tuple[str, ...], baseline: str | None = None) -> Tools:
    """The router's, the prototypes' and the baseline's venvs, made when this run needs them."""
    router = VLLM_ROUTER.ensure().bin("vllm-router") if "vllm-router" in targets else None
    base = baseline_python(baseline)[0] if baseline is not None else None
    if any(t in PROTOTYPES for t in targets):
        return Tools(router, CANDIDATES.ensure().python, candidate_env(), base)
    return Tools(router, None, None, base)


def run(
    settings: Settings,
    targets: tuple[str, ...],
    cores: Cores,
    *,
    keys: bool = True,
    baseline: str | None = None,
) -> int:
    wrk, nginx = ensure_tools()
    if baseline is not None:
        targets = (*targets, BASELINE) if BASELINE not in targets else targets
    tools = ensure_venvs(targets, baseline)
    raise_fd_limit()
    report = Report(machine(wrk, nginx, tools), settings, cores=cores.describe())
    if baseline is not None:
        report.baseline = resolve(baseline)
        print(f"baseline: gpugate at {report.baseline[:12]} as {BASELINE}, from its own venv")
    print("== Machine ==\n" + "  ".join(f"{k}: {v}" for k, v in report.machine.items()))
    print(f"cores: {report.cores}")
    os.sched_setaffinity(0, cores.load)  # this process, wrk and the fake upstreams
    with tempfile.TemporaryDirectory(prefix="gpugate-bench-") as tmp, Processes(Path(tmp)) as procs:
        setup = start_all(procs, nginx, targets, cores, tools)
        report.targets, report.proxies = setup.targets, setup.proxies
        read_rss(setup, report, "idle")
        phase_throughput(setup, wrk, report)
        phase_routing_rps(setup, wrk, report)
        phase_picker(report)  # beside the routing phase's req/s
        if keys:
            problems, report.keys = phase_keys(setup, wrk, procs, cores, settings.duration)
            report.problems += problems
        phase_workers(setup, wrk, procs, report)
        read_rss(setup, report, "loaded")
        phase_bursts(setup, report)
        phase_latency(setup, report)
        phase_ttfb(setup, report)
        phase_held(setup, report)
        procs.check()
    print_summary(report)
    if report.problems:
        print("\nFAILED:\n" + "\n".join(f"  - {p}" for p in report.problems), file=sys.stderr)
        return 1
    return 0


def choose_targets(args: argparse.Namespace) -> tuple[str, ...]:
    if args.targets:
        chosen = [t.strip() for t in args.targets.split(",") if t.strip()]
        unknown = [t for t in chosen if t not in (*TARGETS, *PROTOTYPES, *OPTIONAL)]
        if unknown:
            raise SystemExit(f"bench: unknown targets: {', '.join(unknown)}")
        known = (*TARGETS, *OPTIONAL, *PROTOTYPES)
        return ("direct", *(t for t in known if t in chosen and t != "direct"))
    if args.workers:
        return ("direct", *WORKERS_RUN)
    return (*TARGETS, *ONE_CORE) if args.candidates else TARGETS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds per measured run (5)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 s runs, fewer streams")
    parser.add_argument(
        "--candidates", action="store_true", help="measure the hot-path prototypes too"
    )
    parser.add_argument(
        "--targets",
        help=f"comma-separated targets (direct is always measured); any of:"
        f" {', '.join([*TARGETS, *OPTIONAL, *PROTOTYPES])} (gpugate-base: see --baseline)",
    )
    parser.add_argument(
        "--no-keys", action="store_true", help="skip the auth.mode keys vs open phase"
    )
    parser.add_argument("--no-pin", action="store_true", help="let every process run on every core")
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also measure gpugate at git revision REV (exported, in its own venv) as"
        f" {BASELINE}, in the same run (e.g. d2daa21: issue #13 done-when 4)",
    )
    parser.add_argument(
        "--workers",
        action="store_true",
        help="one process against two (SO_REUSEPORT), every process on every core",
    )
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
        pin = not (args.no_pin or args.workers)
        cores = Cores.split(pin=pin)
        targets = choose_targets(args)
        return run(settings, targets, cores, keys=not args.no_keys, baseline=args.baseline)
    except (BenchError, VenvError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted; every process it started is stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
