"""The paced bursts alone, alternated: where a gateway's burst tail stands against another's.

``bench/proxy.py`` measures each target's bursts once, one after the other, so one collector
pause or one busy moment of the machine decides a target's p99 (64 requests answered late at
once are 2.5 % of a 5 s run's). This runs only that phase, several rounds with the targets in a
rotated order, each round beside ``direct`` (the fake upstream itself), and prints every round
and the medians of the added p50 / p99 (and, for the tail's cause, the worst burst's median).
Optionally the throughput of chat and SSE (wrk) the same way, for the CPU per request.

    python bench/proxy_bursts.py [--rounds 5] [--duration 3] [--targets gpugate,gpugate-gc]
        [--baseline d2daa21] [--tree NAME=SRC ...] [--wrk]

``--tree main=/tmp/base/src`` adds ``gpugate@main``: ``gpugate serve`` with ``PYTHONPATH`` at
another checkout's ``src`` (this venv's libraries), to compare a change against its parent in
the same run. Each gateway pinned to its own core as in ``proxy.py``; the load on the others.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop
from proxy_load import (
    BODIES,
    BURST,
    MIXES,
    RATE,
    Bursts,
    paced_bursts,
    pct,
    run_wrk,
    slow_streams,
)
from proxy_report import fmt, table
from proxy_targets import (
    BASELINE,
    CHAT,
    GATEWAYS,
    HERE,
    LANES,
    BenchError,
    Cores,
    Processes,
    Setup,
    Tools,
    free_port,
    gateway_yaml,
    start_all,
    wait_http,
)
from venvs import VenvError

from proxy import ensure_tools, ensure_venvs, raise_fd_limit

TTFB_CLIENTS = 256  # as bench/proxy.py's slow-streams phase


def start_gateway(
    procs: Processes,
    setup: Setup,
    cores: Cores,
    target: str,
    tools: Tools,
    trees: dict[str, str],
    gc_watch: Path | None,
) -> None:
    """``target`` started: a gateway of :data:`GATEWAYS`, or ``gpugate@NAME`` (this venv's
    python, the tree ``trees[NAME]``'s gpugate); with ``gc_watch``, its collections timed."""
    port = free_port()
    policy = GATEWAYS.get(target, "prefix_affinity")
    config = procs.workdir / f"{target}.yaml"
    config.write_text(gateway_yaml(procs.workdir, port, setup.ports["direct"], policy))
    python = sys.executable
    env = dict(os.environ)
    if target == BASELINE:
        assert tools.baseline_python is not None
        python = tools.baseline_python
        env.pop("PYTHONPATH", None)
    elif target.startswith("gpugate@"):
        env["PYTHONPATH"] = trees[target.partition("@")[2]]
    if gc_watch is not None:
        env["GPUGATE_GC_WATCH"] = str(gc_watch / f"{target}.json")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (env.get("PYTHONPATH"), str(HERE))))
        env["GPUGATE_GC_TUNE"] = "1" if target == "gpugate-gc" else "0"
        program = [str(HERE / "proxy_gc_watch.py")]
    elif target == "gpugate-gc":
        program = [str(HERE / "proxy_gc_serve.py")]
    else:
        program = ["-m", "gpugate"]
    serve = ["serve", "--config", str(config), "--log-level", "WARNING"]
    pid = procs.start(target, cores.wrap([python, *program, *serve]), env=env)
    setup.ports[target] = dict.fromkeys(LANES, port)
    setup.pids[target] = dict.fromkeys(LANES, pid)
    wait_http(procs, f"http://127.0.0.1:{port}/readyz", timeout_s=60)


def gc_counts(gc_watch: Path | None, target: str) -> dict[str, Any] | None:
    """The target's collections so far (``proxy_gc_watch.py``'s file, fresh), if watched."""
    if gc_watch is None:
        return None
    time.sleep(0.6)  # the file is rewritten every 0.5 s
    path = gc_watch / f"{target}.json"
    return json.loads(path.read_text()) if path.exists() else None


def gc_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """``n0/n1/n2 (total ms)`` between two readings, ``—`` when not watched."""
    if before is None or after is None:
        return "—"
    n = [after[g]["n"] - before[g]["n"] for g in "012"]
    ms = sum(after[g]["total_ms"] - before[g]["total_ms"] for g in "012")
    return f"{n[0]}/{n[1]}/{n[2]} ({ms:.1f})"


def burst_row(b: Bursts) -> tuple[float, float, float]:
    """p50, p99 and the worst burst's median latency (ms)."""
    per_burst = [
        statistics.median(b.latency_ms[i : i + BURST]) for i in range(0, len(b.latency_ms), BURST)
    ]
    return pct(b.latency_ms, 50), pct(b.latency_ms, 99), max(per_burst, default=float("nan"))


def prepare(
    args: argparse.Namespace,
) -> tuple[dict[str, str], list[str], Tools, tuple[str, str], Cores]:
    """From ``--targets``, ``--baseline`` and ``--tree``: the trees, the targets (each once),
    their venvs, wrk and nginx, and the cores split (this process moved to the load's)."""
    trees = dict(spec.partition("=")[::2] for spec in args.tree)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if args.baseline:
        targets.append(BASELINE)
    targets = list(dict.fromkeys([*targets, *(f"gpugate@{name}" for name in trees)]))
    tools_found = ensure_tools()
    tools = ensure_venvs(tuple(targets), args.baseline)
    raise_fd_limit()
    cores = Cores.split(pin=True)
    print(f"cores: {cores.describe()}", flush=True)
    os.sched_setaffinity(0, cores.load)
    return trees, targets, tools, tools_found, cores


def main() -> int:  # noqa: C901, PLR0912, PLR0915 - one linear script
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=int, default=3, help="seconds of bursts per target")
    parser.add_argument("--targets", default="gpugate", help=f"any of {', '.join(GATEWAYS)}")
    parser.add_argument("--baseline", metavar="REV", help="also gpugate at REV (gpugate-base)")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=SRC")
    parser.add_argument("--wrk", action="store_true", help="chat and SSE req/s too, each round")
    parser.add_argument(
        "--ttfb", action="store_true", help="time to first byte of 256 slow streams too"
    )
    parser.add_argument(
        "--gc-watch", action="store_true", help="time every collection (proxy_gc_watch.py)"
    )
    args = parser.parse_args()
    try:
        trees, targets, tools, (wrk, nginx), cores = prepare(args)
    except VenvError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    added: dict[str, list[tuple[float, float, float]]] = {}
    rps: dict[tuple[str, str], list[tuple[float, float]]] = {}
    ttfb: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="gpugate-bench-") as tmp, Processes(Path(tmp)) as procs:
        gc_watch = Path(tmp) if args.gc_watch else None
        try:
            setup = start_all(procs, nginx, ("direct",), cores, tools)
            for target in targets:
                start_gateway(procs, setup, cores, target, tools, trees, gc_watch)
        except BenchError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 1
        for target in targets:  # warm every target up alike (and its pools)
            uvloop.run(
                paced_bursts(setup.url(target, "json", CHAT), BODIES["chat"], BURST, RATE, 1)
            )
        for k in range(args.rounds):
            order = targets[k % len(targets) :] + targets[: k % len(targets)]
            direct = burst_row(
                uvloop.run(
                    paced_bursts(setup.url("direct", "json", CHAT), BODIES["chat"], BURST, RATE, 2)
                )
            )
            rows = []
            for target in order:
                collected = gc_counts(gc_watch, target)
                b = uvloop.run(
                    paced_bursts(
                        setup.url(target, "json", CHAT),
                        BODIES["chat"],
                        BURST,
                        RATE,
                        args.duration,
                    )
                )
                p50, p99, worst = burst_row(b)
                late = pct(b.late_ms, 99)
                added.setdefault(target, []).append((p50 - direct[0], p99 - direct[1], worst))
                rows.append(
                    [
                        target,
                        fmt(p50 - direct[0], 2),
                        fmt(p99 - direct[1], 2),
                        fmt(worst, 2),
                        fmt(late, 2),
                        str(b.errors),
                        gc_delta(collected, gc_counts(gc_watch, target)),
                    ]
                )
                if args.wrk:
                    for mix in ("chat", "sse"):
                        lane, path = MIXES[mix]
                        load = run_wrk(
                            wrk,
                            setup.url(target, lane, path),
                            BODIES[mix],
                            args.duration,
                            setup.pid(target, lane),
                        )
                        rps.setdefault((target, mix), []).append((load.rps, load.cpu_us))
                if args.ttfb:
                    slow = uvloop.run(
                        slow_streams(
                            setup.url(target, "slow", CHAT),
                            BODIES["slow"],
                            TTFB_CLIENTS,
                            0.0,
                            args.duration,
                        )
                    )
                    ttfb.setdefault(target, []).append(
                        (pct(slow.ttfb_ms, 50), pct(slow.ttfb_ms, 99))
                    )
            print(f"\n== round {k + 1}: direct p50 {direct[0]:.2f} p99 {direct[1]:.2f} ms ==")
            headers = ["target", "+p50", "+p99", "worst burst", "late p99", "errors"]
            print(table([*headers, "collections 0/1/2 (ms in all)"], rows))
            if args.wrk:
                wrk_rows = [
                    [t, mix, fmt(rps[t, mix][-1][0]), fmt(rps[t, mix][-1][1])]
                    for t in order
                    for mix in ("chat", "sse")
                ]
                print(table(["target", "mix", "req/s", "CPU µs/req"], wrk_rows), flush=True)
        procs.check()
    print(f"\n== medians of {args.rounds} rounds, bursts of {BURST} at {RATE:g} req/s ==")
    rows = []
    for target, values in added.items():
        row = [target] + [fmt(statistics.median(v[i] for v in values), 2) for i in range(3)]
        row.append(" ".join(f"{v[1]:+.1f}" for v in values))
        if args.wrk:
            row += [fmt(statistics.median(r[0] for r in rps[target, m])) for m in ("chat", "sse")]
        rows.append(row)
    headers = ["target", "+p50", "+p99", "worst burst", "+p99 per round"]
    if args.wrk:
        headers += ["chat req/s", "SSE req/s"]
    print(table(headers, rows))
    if args.ttfb:
        print(f"\n== time to first byte, {TTFB_CLIENTS} slow streams: p50 / p99 ms per round ==")
        rows = [
            [
                t,
                " ".join(f"{a:.2f}/{b:.2f}" for a, b in v),
                fmt(statistics.median(b for _, b in v), 2),
            ]
            for t, v in ttfb.items()
        ]
        print(table(["target", "p50/p99 per round", "median p99"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
