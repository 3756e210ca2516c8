"""The cost of ``auth.mode: keys`` on the hot path (issue #16, Done-when 5), a phase of
``bench/proxy.py``: a second gpugate on the same upstreams and core, in keys mode with three
bootstrap keys from the environment, measured with wrk (the same ``-c64`` POSTs, the key in
``Authorization: Bearer``) *at the same time* as the open gpugate of the run, each loaded by its
own wrk, the two sharing the proxies' core: the kernel gives each half of it, so their req/s
compare what a request costs each, in one window, and the machine's noise falls on both alike.
A share is the median of the rounds' own shares. One key has no limits (its lookup, a local
cache hit after the first request, and the usage read from the body), one has limits (rpm, tpm
and daily tokens: leased in slices from the store, SQLite here as the bench's gpugate, so a
store transaction every slice rather than every request), one has a concurrency limit above
wrk's connections (its slots leased and kept while it is busy). Prints the req/s share and the
CPU per request against open's.

Run alone (the open gpugate and the keyed one only, from the ``gpugate`` on ``PYTHONPATH``, so
another tree's ``src`` gives that tree's figures with this script)::

    python bench/proxy_keys.py [--duration 5] [--rounds 5]

``--instructions`` counts instead, with callgrind (``valgrind``, installed with apt when missing):
the machine instructions per request of gpugate's own code, open against each key, with no
transport (the data plane's ``Handler`` and ``ClientKeys.serve`` over an exchange in memory, as
the fast path calls them; the upstream client answers from memory as in
``hotpath_micro.py --gateway``). Unlike CPU time it does not move with the machine's load, so a
change of a few hundred instructions shows; what it cannot show is what the real server's
colder caches add (about 2-3x per instruction on the keys' own code)::

    python bench/proxy_keys.py --instructions [--requests 400]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from proxy_load import BODIES, MIXES, run_wrk_at_once
from proxy_targets import (
    BenchError,
    Cores,
    Processes,
    Setup,
    free_port,
    gateway_yaml,
    start_all,
    wait_http,
)

KEY_FREE = "gk-bench-free-" + "x" * 32
KEY_LIMITED = "gk-bench-limited-" + "y" * 32
KEY_CONCURRENT = "gk-bench-concurrent-" + "z" * 32
CONCURRENCY = 256  # above wrk's 64 connections: never refused, its slots leased and kept
BIG = 10**9
ROUNDS = 5


def key_env() -> dict[str, str]:
    """The two bootstrap keys, as ``auth.bootstrap_keys_env: BENCH_KEYS`` reads them."""
    limits = {"requests_per_min": BIG, "tokens_per_min": BIG, "daily_tokens": BIG}  # leased
    keys = [
        {"name": "free", "tenant": "bench", "key": KEY_FREE, "max_class": "system"},
        {"name": "limited", "tenant": "bench", "key": KEY_LIMITED, "limits": limits},
        {
            "name": "concurrent",
            "tenant": "bench",
            "key": KEY_CONCURRENT,
            "limits": {"concurrency": CONCURRENCY},
        },
    ]
    return {"BENCH_KEYS": json.dumps(keys)}


#: The keys measured against open: none of limits, leased rpm/tpm/daily tokens, concurrency.
KEYED = {"keys": KEY_FREE, "keys+limits": KEY_LIMITED, "keys+concurrency": KEY_CONCURRENT}


def start_keyed(procs: Processes, setup: Setup, cores: Cores) -> tuple[int, int]:
    """The keyed gpugate, on a free port: its port and pid."""
    workdir, port = procs.workdir, free_port()
    upstreams = setup.ports["direct"]
    yaml = gateway_yaml(workdir, port, upstreams)  # its own store: named by its port
    yaml += "auth: {mode: keys, bootstrap_keys_env: BENCH_KEYS}\n"
    (workdir / "gateway-keys.yaml").write_text(yaml)
    env = {**os.environ, **key_env()}
    serve = ["serve", "--config", str(workdir / "gateway-keys.yaml"), "--log-level", "WARNING"]
    argv = cores.wrap([sys.executable, "-m", "gpugate", *serve])
    pid = procs.start("gpugate-keys", argv, env=env)
    wait_http(procs, f"http://127.0.0.1:{port}/readyz", timeout_s=60)
    return port, pid


def phase_keys(
    setup: Setup, wrk: str, procs: Processes, cores: Cores, duration: int, rounds: int = ROUNDS
) -> tuple[list[str], dict[str, float]]:
    """Measure and print; the problems found (a non-2xx answer, a socket error), and keys'
    req/s as a share of open's per mix and key (``"chat keys"``, ``"sse keys+limits"``, ...).

    The open gpugate and the keyed one are loaded **at the same time**, each by its own wrk,
    and share the proxies' core: both always have requests waiting, so the kernel's scheduler
    gives each half of the core, and what one serves against the other is the inverse of what
    a request costs each — measured in one window, so a neighbour that takes the core for a
    while takes it from both alike (a shared machine's req/s moves by 20-40 % between runs a
    few seconds apart: pairs measured one after the other mostly measured that). A round is
    open beside each key of :data:`KEYED` in turn; a share is the median of the rounds'
    (``paired``); the CPU each process used in its windows is printed beside it."""
    shares: dict[str, float] = {}
    if "gpugate" not in setup.targets:
        return [], shares
    port, keyed_pid = start_keyed(procs, setup, cores)
    print(
        f"\n== auth.mode keys vs open: wrk -t1 -c64 -d{duration}s against each at once, sharing"
        f" the proxies' core, {rounds} rounds =="
    )
    problems: list[str] = []
    for mix in ("chat", "sse"):
        lane, path = MIXES[mix]
        opened = (setup.url("gpugate", lane, path), setup.pid("gpugate", lane), None)
        keyed_url = f"http://127.0.0.1:{port}{path}"
        ratios: dict[str, list[float]] = {name: [] for name in KEYED}
        cpu: dict[str, list[float]] = {name: [] for name in ratios}
        for _ in range(rounds):
            for name, key in KEYED.items():
                base, load = run_wrk_at_once(
                    wrk, BODIES[mix], duration, opened, (keyed_url, keyed_pid, key)
                )
                ratios[name].append(load.rps / base.rps)
                cpu[name].append(load.cpu_us / base.cpu_us)
                for who, got in (("open", base), (name, load)):
                    if got.non_2xx or got.socket_errors:
                        problems.append(
                            f"{mix} via gpugate {who}: {got.non_2xx} non-2xx,"
                            f" {got.socket_errors} socket errors"
                        )
        for name, values in ratios.items():
            shares[f"{mix} {name}"] = paired = statistics.median(values)
            runs_text = " / ".join(f"{v:5.1%}" for v in values)
            print(
                f"  {mix:<5} {name:<16} {paired:6.1%} of open's req/s (rounds: {runs_text});"
                f" CPU per request {statistics.median(cpu[name]):6.1%} of open's"
            )
    return problems, shares


# -- instructions per request (callgrind) -------------------------------------------------------

KINDS = {"open": None, **KEYED}
_TOGGLE = "functools_reduce"  # callgrind counts only inside this C function: the measured loop


class _MemoryExchange:
    """The fast path's exchange, in memory: the body handed over, the answer counted."""

    __slots__ = (
        "_body",
        "answered",
        "headers",
        "keyed",
        "method",
        "path",
        "query",
        "server",
        "status",
    )

    def __init__(self, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.method, self.path, self.query = "POST", "/v1/chat/completions", b""
        self.headers, self.server, self._body = headers, ("127.0.0.1", 1), body
        self.status: int | str = "-"
        self.answered: list[tuple[bytes, bytes]] = []
        self.keyed = None

    def raw_target(self) -> bytes:
        return b"/v1/chat/completions"

    async def read_body(self, _declared: int | None, _limit: int) -> bytes:
        return self._body

    async def start(self, status: int, headers: Any, *, hold: bool = False) -> None:  # noqa: ARG002
        self.status, self.answered = status, headers

    async def body(self, chunk: bytes, *, more: bool) -> None:
        keyed = self.keyed  # as FastCycle.body: a stream's usage the client did not ask for
        if keyed is not None and keyed.stream is not None:
            keyed.stream.hidden(chunk, more=more)

    async def answer(self, status: int, headers: Any, _body: bytes) -> None:
        self.status, self.answered = status, headers

    async def while_connected(self, work: Any) -> None:
        await work


def _counted_child(mix: str, kind: str, requests: int) -> None:
    """In the child under callgrind: warm up, switch instrumentation on, run ``requests``
    requests inside ``functools.reduce`` (the only code counted), leave."""
    import uvloop
    from hotpath_micro import _stub_send
    from proxy_targets import chat_completion, sse_stream

    from gpugate.config.loader import parse_config
    from gpugate.web.app import create_app
    from gpugate.web.fastpath import FastRoutes
    from gpugate.wiring import build_gateway

    answers = {
        "chat": ([(b"content-type", b"application/json")], [chat_completion()]),
        "sse": ([(b"content-type", b"text/event-stream")], [sse_stream()]),
    }
    tmp = tempfile.mkdtemp(prefix="gpugate-keys-count-")
    models = "[json-model, sse-model]"
    config = parse_config(
        f"listen: 127.0.0.1:1\nstore: sqlite:///{tmp}/count.db\nupstreams:\n"
        f"  - {{id: json-model, urls: ['http://127.0.0.1:9', 'http://127.0.0.1:10'],"
        f" models: {models}, max_inflight: 4096, max_queue: 10000}}\n"
        "auth: {mode: keys, bootstrap_keys_env: BENCH_KEYS}\n"
    )
    loop = uvloop.new_event_loop()
    built = build_gateway(
        config, environ={**os.environ, **key_env()}, probe_interval_s=3600, run_job_loops=False
    )
    gw = loop.run_until_complete(built.__aenter__())
    gw.proxy._client.send = _stub_send([answers[mix]])  # noqa: SLF001
    routes = FastRoutes.find(create_app(gw))
    assert routes is not None
    assert routes.keys is not None
    body, key = BODIES[mix], KINDS[kind]

    async def run(n: int) -> None:
        for _ in range(n):
            headers = [
                (b"host", b"127.0.0.1:8080"),
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ]
            if key is not None:
                headers.append((b"authorization", b"Bearer " + key.encode()))
            ex = _MemoryExchange(headers, body)
            if key is None:
                await routes.handler.serve(ex, openai=True)
            else:
                await routes.keys.serve(ex, routes.handler)
            assert ex.status == 200, ex.status

    loop.run_until_complete(run(300))  # warm: the key cache, the lease, every code path
    control = subprocess.Popen(["callgrind_control", "-i", "on", str(os.getpid())])
    while control.poll() is None:  # busy, so that valgrind sees the command
        pass
    functools.reduce(lambda _a, _b: loop.run_until_complete(run(requests)), [0], 0)
    os._exit(0)  # no teardown counted or waited for


def count_instructions(requests: int) -> int:
    """Instructions per request for each mix and kind, printed with their share of open's."""
    if shutil.which("valgrind") is None:
        subprocess.run(["apt-get", "install", "-y", "valgrind"], check=True)
    print(f"== instructions per request, in process, callgrind ({requests} requests each) ==")
    for mix in ("chat", "sse"):
        base = 0
        for kind in KINDS:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "callgrind.out"
                argv = [
                    "valgrind", "--tool=callgrind", "--instr-atstart=no",
                    "--collect-atstart=no", f"--toggle-collect={_TOGGLE}",
                    f"--callgrind-out-file={out}",
                    sys.executable, __file__, "--count-child", mix, kind, str(requests),
                ]  # fmt: skip
                done = subprocess.run(argv, capture_output=True, text=True, check=False)
                totals = [ln for ln in out.read_text().splitlines() if ln.startswith("summary:")]
                if done.returncode != 0 or not totals:
                    print(done.stderr[-2000:], file=sys.stderr)
                    return 1
                per = int(totals[0].split()[1]) // requests
            base = base or per
            print(
                f"  {mix:<5} {kind:<16} {per:9,d} instructions a request"
                f"  (+{per - base:7,d}, {per / base:6.1%} of open)"
            )
    return 0


def main() -> int:
    from proxy import ensure_tools, ensure_venvs, raise_fd_limit

    if sys.argv[1:2] == ["--count-child"]:
        _counted_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    parser = argparse.ArgumentParser(description="auth.mode keys against open, alone")
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run (5)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"alternated rounds ({ROUNDS})")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions (callgrind) instead"
    )
    parser.add_argument("--requests", type=int, default=400, help="requests counted (400)")
    args = parser.parse_args()
    if args.instructions:
        return count_instructions(args.requests)
    wrk, nginx = ensure_tools()
    targets = ("direct", "gpugate")
    tools = ensure_venvs(targets)
    raise_fd_limit()
    cores = Cores.split(pin=True)
    os.sched_setaffinity(0, cores.load)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="gpugate-keys-") as tmp,
            Processes(Path(tmp)) as procs,
        ):
            setup = start_all(procs, nginx, targets, cores, tools)
            problems, _ = phase_keys(setup, wrk, procs, cores, args.duration, args.rounds)
            procs.check()
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    if problems:
        print("\nFAILED:\n" + "\n".join(f"  - {p}" for p in problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
