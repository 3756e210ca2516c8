"""Machine instructions per request of the whole ``gpugate serve`` process, transport included:
the open chat and SSE paths as ``bench/proxy.py`` loads them, counted with callgrind.

``hotpath_micro.py --gateway`` and ``proxy_keys.py --instructions`` count gpugate's own code
over an exchange in memory; what the real server spends besides — uvicorn's protocol and
httptools' callbacks, the fast path's cycle, the upstream client's connection, the event loop —
is most of a request's CPU (§22b: 66 % of it in the interpreter, spread thin). Here the server
itself runs under ``valgrind --tool=callgrind`` in front of the bench's fake upstream (nginx),
with instrumentation switched on only while ``wrk -t1 -c8`` (``bench/post.lua``) loads it, so
the count is of user-space instructions per answered request: the kernel's share (the system
calls) is not in it. Taken off: the cyclic collector's (printed apart: how many collections
land in a window is chance) and what the server runs per second without requests (counted in
an idle window first). Unlike CPU time it does not move with the machine's load, so trees can
be compared one after the other on a shared machine::

    python bench/proxy_instructions.py [--tree main=/work/main/src ...] [--mixes chat,sse]
        [--duration 20] [--rounds 1] [--annotate] [--keys]

``--keys`` counts each tree twice, open and then with ``auth.mode: keys`` (``proxy_keys.py``'s
bootstrap key without limits in ``Authorization: Bearer``): what #16's keys cost the whole
server, which the in-process count leaves part of out (the head as wrk sends it, the cycle).

Each tree is ``gpugate serve`` with ``PYTHONPATH`` at that checkout's ``src`` (this venv's
libraries); without ``--tree`` only the ``gpugate`` on ``PYTHONPATH``. Under callgrind the
server answers ~50x slower than it would, so the connections always have requests queued: what
is counted is a loaded server's path.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from proxy_keys import KEY_FREE, key_env
from proxy_load import BODIES, MIXES, parse_wrk
from proxy_targets import (
    HERE,
    BenchError,
    Cores,
    Processes,
    Tools,
    free_port,
    gateway_yaml,
    start_all,
    wait_http,
)

from proxy import ensure_tools

T = TypeVar("T")


CONNECTIONS = 8
"""wrk's connections: enough to keep the server under callgrind always busy, few enough that
the requests in flight at the window's edges (counted in part, or not at all) are ~0.5 % of
those counted (64 made it ~4 %)."""


def _wrk(wrk: str, url: str, body: bytes, duration: int, bearer: str | None = None) -> int:
    """Requests answered by ``wrk -t1 -c8`` in ``duration`` seconds (non-2xx is an error),
    with ``Authorization: Bearer <bearer>`` when given."""
    argv = [
        wrk, "-t1", f"-c{CONNECTIONS}", f"-d{duration}s", "--latency", "--timeout", "60s",
        "-s", str(HERE / "post.lua"), url,
    ]  # fmt: skip
    env = {**os.environ, "BENCH_BODY": body.decode()}
    if bearer is not None:
        env["BENCH_BEARER"] = bearer
    done = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=duration + 120, check=False
    )
    load = parse_wrk(done.stdout, 0.0)
    if done.returncode != 0 or load.non_2xx or load.socket_errors:
        raise BenchError(f"wrk: {done.returncode}, {load.non_2xx} non-2xx: {done.stdout}")
    return load.requests


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], capture_output=True, check=True, timeout=120)


def count(
    procs: Processes, up: dict[str, int], wrk: str, name: str, src: str | None, mix: str,
    duration: int, *, annotate: bool = False, keyed: bool = False,
) -> tuple[int, int]:  # fmt: skip
    """One tree's instructions per ``mix`` request, the cyclic collector's apart (and those):
    its server started under callgrind, warmed, counted through one wrk run, stopped
    (``keyed``: with ``auth.mode: keys``, each request with the bench's key)."""
    workdir, port = procs.workdir, free_port()
    name = f"{name}-keys" if keyed else name
    config = workdir / f"{name}-{mix}.yaml"
    yaml = gateway_yaml(workdir, port, up)  # its own store: named by its port
    bearer = None
    if keyed:
        yaml += "auth: {mode: keys, bootstrap_keys_env: BENCH_KEYS}\n"
        bearer = KEY_FREE
    config.write_text(yaml)
    out = workdir / f"{name}-{mix}.callgrind"
    env = {**os.environ, **(key_env() if keyed else {})}
    env.pop("PYTHONPATH", None)
    if src is not None:
        env["PYTHONPATH"] = src
    argv = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
        sys.executable, "-m", "gpugate", "serve", "--config", str(config),
        "--log-level", "WARNING",
    ]  # fmt: skip
    label = f"{name}-{mix}"
    pid = procs.start(label, argv, env=env)
    try:
        wait_http(procs, f"http://127.0.0.1:{port}/readyz", timeout_s=300)
        _, path = MIXES[mix]
        url = f"http://127.0.0.1:{port}{path}"
        _wrk(wrk, url, BODIES[mix], 3, bearer)  # warm: the pool, the key cache, every path
        time.sleep(2)  # the requests wrk left in flight are answered
        idle_s = _counted(pid, lambda: time.sleep(IDLE_S))[1]
        requests, load_s = _counted(pid, lambda: _wrk(wrk, url, BODIES[mix], duration, bearer))
        idle, load = (workdir / f"{out.name}.{n}" for n in (1, 2))  # callgrind's numbering
        deadline = time.monotonic() + 60
        while not load.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        procs.stop_one(label)
    if annotate:
        shown = subprocess.run(
            ["callgrind_annotate", "--inclusive=no", str(load)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        print("\n".join(shown.stdout.splitlines()[:60]))
    (idle_all, idle_gc), (load_all, load_gc) = _totals(idle), _totals(load)
    background = (idle_all - idle_gc) * load_s / idle_s
    requests = max(requests, 1)
    return round((load_all - load_gc - background) / requests), load_gc // requests


IDLE_S = 5.0
"""The idle window whose instructions (the timers and loops that run without requests: the
prober, the collector's tick, the console's ring) are taken off the load's, per second: under
callgrind the server answers ~150 requests a second, so what runs per second is a share of
each request that moves with how fast the machine let it go."""


def _counted(pid: int, work: Callable[[], T]) -> tuple[T, float]:
    """``work()``'s result and seconds, with ``pid``'s instructions counted meanwhile and then
    dumped (callgrind's next numbered file)."""
    _control("-i", "on", str(pid))
    started = time.monotonic()
    result = work()
    elapsed = time.monotonic() - started
    _control("-i", "off", str(pid))
    _control("-d", str(pid))
    return result, elapsed


def _totals(dump: Path) -> tuple[int, int]:
    """The instructions of ``dump``, and of those the cyclic collector's."""
    for line in dump.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1]), _collector(dump)
    raise BenchError(f"no totals in {dump}")


def _collector(dump: Path) -> int:
    """The instructions of ``dump`` spent in the cyclic collector (``gc_collect_main``,
    inclusive): how many collections land in a window moves the total by a few per cent."""
    shown = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(dump)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    for line in shown.stdout.splitlines():
        if line.rstrip().endswith("]") and ":gc_collect_main " in line:
            return int(line.split()[0].replace(",", ""))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="instructions per request of gpugate serve")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=SRC")
    parser.add_argument("--mixes", default="chat,sse", help="chat, sse or both (chat,sse)")
    parser.add_argument("--duration", type=int, default=20, help="seconds counted (20)")
    parser.add_argument(
        "--annotate", action="store_true", help="print the C functions that count the most"
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternated rounds (1)")
    parser.add_argument(
        "--keys", action="store_true", help="each tree open and with auth.mode: keys"
    )
    args = parser.parse_args()
    trees: list[tuple[str, str | None]] = [
        (spec.partition("=")[0], spec.partition("=")[2]) for spec in args.tree
    ] or [("gpugate", os.environ.get("PYTHONPATH"))]
    kinds = (False, True) if args.keys else (False,)
    wrk, nginx = ensure_tools()
    tools = Tools(vllm_router=None, candidates_python=None, candidate_env=None)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="gpugate-instr-") as tmp,
            Processes(Path(tmp)) as procs,
        ):
            setup = start_all(procs, nginx, ("direct",), Cores.split(pin=False), tools)
            up = setup.ports["direct"]
            print(f"== instructions per request, gpugate serve, callgrind, wrk -c{CONNECTIONS} ==")
            for mix in args.mixes.split(","):
                base = 0
                for rnd in range(args.rounds):
                    for (name, src), keyed in itertools.product(trees, kinds):
                        per, gc = count(
                            procs, up, wrk, name, src, mix, args.duration,
                            annotate=args.annotate, keyed=keyed,
                        )  # fmt: skip
                        base = base or per
                        label = f"{name}-keys" if keyed else name
                        print(
                            f"  {mix:<5} round {rnd + 1} {label:<15} {per:11,d} instructions"
                            f" a request ({per / base:6.1%} of the first), {gc:7,d} more in"
                            " the cyclic collector",
                            flush=True,
                        )
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
