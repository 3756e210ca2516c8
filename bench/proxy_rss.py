"""The memory phase alone: a gateway's resident memory idle, after load and with open streams.

``bench/proxy.py`` reads each proxy's RSS once per run, after every other phase; this runs only
what it takes to get there — wrk chat and SSE (the heap the load leaves), then ``--streams``
long streams held open at once — for several gateways side by side in one run (``--tree
NAME=SRC``: another checkout's ``src`` with this venv's libraries, as in ``proxy_bursts.py``),
and prints each one's RSS and what one open stream costs.

    python bench/proxy_rss.py [--streams 1000] [--duration 3] [--rounds 1]
        [--targets gpugate] [--tree main=/tmp/main/src ...]

Each round starts every gateway afresh (the RSS of a process is what its own history left).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

import uvloop
from proxy_bursts import prepare, start_gateway
from proxy_load import BODIES, MIXES, hold_streams, run_wrk
from proxy_report import fmt, table
from proxy_targets import CHAT, BenchError, Processes, rss_mb, start_all
from venvs import VenvError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--duration", type=int, default=3, help="seconds of wrk per mix")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--targets", default="gpugate")
    parser.add_argument("--baseline", metavar="REV", help="also gpugate at REV (gpugate-base)")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=SRC")
    args = parser.parse_args()
    try:
        trees, targets, tools, (wrk, nginx), cores = prepare(args)
    except VenvError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    rows: dict[str, list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="gpugate-bench-") as tmp, Processes(Path(tmp)) as procs:
        try:
            setup = start_all(procs, nginx, ("direct",), cores, tools)
        except BenchError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 1
        stats_url = setup.url("direct", "long", "/_stats")
        for k in range(args.rounds):
            order = targets[k % len(targets) :] + targets[: k % len(targets)]
            for target in order:
                start_gateway(procs, setup, cores, target, tools, trees, None)
                pid = setup.pid(target)
                idle = rss_mb(pid)
                for mix in MIXES:
                    lane, path = MIXES[mix]
                    run_wrk(wrk, setup.url(target, lane, path), BODIES[mix], args.duration, pid)
                loaded = rss_mb(pid)
                url = setup.url(target, "long", CHAT)
                held = uvloop.run(
                    hold_streams(url, BODIES["long"], args.streams, partial(rss_mb, pid), stats_url)
                )
                if held.opened != args.streams:
                    print(f"  {target}: {held.opened}/{args.streams} streams opened")
                rows.setdefault(target, []).append((idle, loaded, held.rss_mb))
                print(
                    f"round {k + 1} {target}: idle {idle:.1f} MB, loaded {loaded:.1f},"
                    f" {args.streams:,} streams {held.rss_mb:.1f}",
                    flush=True,
                )
                procs.stop_one(target)
    per = f"KB per stream (streams - loaded) / {args.streams:,}"
    out = []
    for target, values in rows.items():
        idle, loaded, streams = (statistics.median(v[i] for v in values) for i in range(3))
        each = (streams - loaded) * 1024 / args.streams
        out.append([target, fmt(idle, 1), fmt(loaded, 1), fmt(streams, 1), fmt(each, 1)])
    print(f"\n== medians of {args.rounds} round(s) ==")
    print(table(["target", "idle MB", "loaded MB", f"{args.streams:,} streams MB", per], out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
