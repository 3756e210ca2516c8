"""The cost of ``auth.mode: keys`` on the hot path (issue #16, Done-when 5), a phase of
``bench/proxy.py``: a second gpugate on the same upstreams and core, in keys mode with two
bootstrap keys from the environment, measured with wrk (the same ``-c64`` POSTs, the key in
``Authorization: Bearer``) alternately with the open gpugate of the run, three rounds, so the
machine's noise falls on all alike; the ratios are of the medians. One key has no limits (its
lookup, a local cache hit after the first request, and the usage read from the body), one has
limits (rpm, tpm and daily tokens: leased in slices from the store, SQLite here as the bench's
gpugate, so a store transaction every slice rather than every request). Prints req/s and the
gateway process's CPU per request (less sensitive to a loaded machine than req/s), and their
ratios to open.

Run alone (the open gpugate and the keyed one only, from the ``gpugate`` on ``PYTHONPATH``, so
another tree's ``src`` gives that tree's figures with this script)::

    python bench/proxy_keys.py [--duration 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from proxy_load import BODIES, MIXES, run_wrk
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
BIG = 10**9
ROUNDS = 3


def key_env() -> dict[str, str]:
    """The two bootstrap keys, as ``auth.bootstrap_keys_env: BENCH_KEYS`` reads them."""
    limits = {"requests_per_min": BIG, "tokens_per_min": BIG, "daily_tokens": BIG}  # leased
    keys = [
        {"name": "free", "tenant": "bench", "key": KEY_FREE, "max_class": "system"},
        {"name": "limited", "tenant": "bench", "key": KEY_LIMITED, "limits": limits},
    ]
    return {"BENCH_KEYS": json.dumps(keys)}


def start_keyed(procs: Processes, setup: Setup, cores: Cores) -> tuple[int, int]:
    """The keyed gpugate, on a free port: its port and pid."""
    workdir, port = procs.workdir, free_port()
    upstreams = setup.ports["direct"]
    yaml = gateway_yaml(workdir, port, upstreams).replace(
        f"sqlite:///{workdir}/bench.db", f"sqlite:///{workdir}/bench-keys.db"
    )
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
    """Measure and print; the problems found (a non-2xx answer), and keys' req/s as a share of
    open's per mix and key (``"chat keys"``, ``"sse keys+limits"``, ...)."""
    shares: dict[str, float] = {}
    if "gpugate" not in setup.targets:
        return [], shares
    port, keyed_pid = start_keyed(procs, setup, cores)
    print(
        f"\n== auth.mode keys vs open: wrk -t1 -c64 -d{duration}s, {rounds} rounds, alternated =="
    )
    problems: list[str] = []
    for mix in ("chat", "sse"):
        lane, path = MIXES[mix]
        rates: dict[str, list[float]] = {"open": [], "keys": [], "keys+limits": []}
        cpu: dict[str, list[float]] = {name: [] for name in rates}
        for _ in range(rounds):
            runs = (
                ("open", setup.url("gpugate", lane, path), setup.pid("gpugate", lane), None),
                ("keys", f"http://127.0.0.1:{port}{path}", keyed_pid, KEY_FREE),
                ("keys+limits", f"http://127.0.0.1:{port}{path}", keyed_pid, KEY_LIMITED),
            )
            for name, url, pid, key in runs:
                load = run_wrk(wrk, url, BODIES[mix], duration, pid, bearer=key)
                rates[name].append(load.rps)
                cpu[name].append(load.cpu_us)
                if load.non_2xx or load.socket_errors:
                    problems.append(f"{mix} via gpugate {name}: {load.non_2xx} non-2xx (wrk)")
        base = statistics.median(rates["open"])
        base_cpu = statistics.median(cpu["open"])
        for name, values in rates.items():
            mean = statistics.median(values)
            runs_text = " / ".join(f"{v:6.0f}" for v in values)
            used = statistics.median(cpu[name])
            if name != "open":
                shares[f"{mix} {name}"] = mean / base
            print(
                f"  {mix:<5} {name:<12} {runs_text} req/s {mean / base:7.1%} of open;"
                f" CPU {used:6.0f} us/req ({used / base_cpu:6.1%})"
            )
    return problems, shares


def main() -> int:
    from proxy import ensure_tools, ensure_venvs, raise_fd_limit

    parser = argparse.ArgumentParser(description="auth.mode keys against open, alone")
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run (5)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"alternated rounds ({ROUNDS})")
    args = parser.parse_args()
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
