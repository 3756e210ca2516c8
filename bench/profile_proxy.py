"""Where a proxy's CPU goes per request (chat, ``--mix sse``): py-spy on it under wrk, as a budget.

For each target (default: gpugate, then the protocol-level prototype), one core each as in
``proxy.py``: a wrk run without the profiler measures the CPU per request; a second one under
``py-spy record`` (200 Hz, the target's own stacks) says how it divides. Each sample goes to
the first category whose rule matches its stack, looking from the innermost frame outwards
(so ``json.loads`` called by the data plane counts as the body's parse, and a ``socket.send``
inside aiohttp as the upstream client). The budget is the share of samples times the CPU per
request measured without the profiler.

    python bench/profile_proxy.py [--duration 5] [--targets gpugate,p-proto] [--mix chat|sse]
        [--out DIR]

The raw stacks are kept in ``--out`` (``<target>.txt``, one line per distinct stack) for a
closer look (e.g. with ``jobs_profile.summarise``). py-spy samples Python frames: the kernel's
share of a socket write or read counts for the Python frame that made the call (uvicorn's, or
aiohttp's, or the prototype's), and the event loop's own C code (epoll, reads, callbacks) shows
as ``asyncio/runners.py``. Granian's targets are not profiled (its Python runs in a child).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from jobs_profile import recording
from proxy_load import BODIES, MIXES, run_wrk
from proxy_report import table
from proxy_targets import PROTOTYPES, BenchError, Cores, Processes, Setup, start_all
from venvs import CANDIDATES, VenvError

from proxy import ensure_tools, ensure_venvs, raise_fd_limit

# (category, pattern on "function (path)" of a frame); the first that matches the innermost
# frame that matches anything decides.
RULES: list[tuple[str, re.Pattern[str]]] = [
    (name, re.compile(pattern))
    for name, pattern in (
        (
            "parse the body (json, the hardening walk)",
            r"\(json/|_routing_fields|_parse_doc|orjson|msgspec|parse_json|gpugate/(config/untrusted|web/bodies)",
        ),
        ("pick (core/picking)", r"gpugate/core/picking\.py"),
        ("admission (core/admission)", r"gpugate/core/admission\.py"),
        ("metrics (prometheus_client)", r"prometheus_client/|gpugate/metrics\.py|Metrics\.record"),
        ("logging", r"\(logging/|gpugate/logs\.py|contextvars"),
        ("idempotency, request ids", r"gpugate/services/idempotency|gpugate/web/requestid"),
        ("aiohttp client: send", r"aiohttp/(client|connector|client_reqrep|helpers|cookiejar)\.py"),
        ("aiohttp client: read the answer", r"aiohttp/(client_proto|streams|http_parser)\.py"),
        ("aiohttp (other)", r"aiohttp/|multidict|yarl/"),
        ("raw upstream client (httptools)", r"hotpath_upstream\.py"),
        ("Starlette", r"starlette/"),
        ("ASGI middleware: headers, shutdown", r"gpugate/web/(response_headers|shutdown)\.py"),
        ("ASGI server: uvicorn", r"uvicorn/"),
        ("data plane: web/dataplane.py", r"gpugate/web/dataplane\.py"),
        ("fast path: web/fastpath.py, connections.py", r"gpugate/web/(fastpath|connections)\.py"),
        ("request path: services/proxy.py", r"gpugate/services/proxy\.py"),
        ("adapter: upstream_client.py", r"gpugate/adapters/upstream_client\.py"),
        ("gpugate (other)", r"gpugate/"),
        ("prototype: server and relay", r"hotpath_proto\.py|hotpath_apps\.py"),
        ("prototype: hot path", r"hotpath\.py"),
        ("asyncio tasks and futures", r"\(asyncio/(tasks|futures|locks|timeouts|events)\.py"),
        ("event loop (uvloop: sockets, epoll, callbacks)", r"\(asyncio/runners\.py|uvloop"),
    )
]
OTHER = "other"

# gpugate's own code, finer (``--in-process``: the whole app, the upstream answering from memory)
OWN_RULES: list[tuple[str, re.Pattern[str]]] = [
    (name, re.compile(pattern))
    for name, pattern in (
        ("the harness (the fake client and upstream)", r"hotpath_micro\.py"),
        ("parse the body (json, the hardening walk)",
         r"\(json/|gpugate/(config/untrusted|web/bodies)"),
        ("routing: prefix hashes, scoring", r"gpugate/core/(scoring|prefix_index)\.py"),
        ("pick: endpoint state (core/picking)", r"gpugate/core/picking\.py"),
        ("admission (core/admission)", r"gpugate/core/admission\.py"),
        ("metrics (prometheus_client)", r"prometheus_client/|gpugate/metrics\.py"),
        ("usage, limits (services/usage, limits)", r"gpugate/(services|core)/(usage|limits)\.py"),
        ("keys: the middleware, the key lookup",
         r"gpugate/(web/auth|services/keys|core/keys)\.py|hashlib"),
        ("telemetry hooks, the Generation reading", r"gpugate/telemetry\.py"),
        ("the attempt loop (services/proxy, attempts)",
         r"gpugate/services/(proxy|attempts|continuation)\.py|gpugate/(retry|core/registry)\.py"),
        ("data plane: web/dataplane.py", r"gpugate/web/dataplane\.py"),
        ("other ASGI middlewares, request ids", r"gpugate/web/"),
        ("gpugate (other)", r"gpugate/"),
        ("asyncio tasks and futures", r"\(asyncio/"),
    )
]  # fmt: skip
GC = "garbage collection (sampled in whatever allocated)"
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<path>[^()]*):\d+\)$")


def categorise(stack: str, rules: list[tuple[str, re.Pattern[str]]] = RULES) -> str:
    """The category of one sample's stack (``frame;frame;...``, outermost first)."""
    for frame in reversed(stack.split(";")):
        match = _FRAME.match(frame)
        text = f"{match['func']} ({match['path']})" if match else frame
        for name, pattern in rules:
            if pattern.search(text):
                return name
    return OTHER


def budget(
    raw: Path, rules: list[tuple[str, re.Pattern[str]]] = RULES, within: str | None = None
) -> Counter[str]:
    """Samples per category; ``within``: only the stacks through that frame (the measured
    loop, not the set-up)."""
    counts: Counter[str] = Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit() or "Thread._bootstrap" in stack:  # the loop only
            continue
        if within is not None and within not in stack:
            continue
        counts[categorise(stack, rules)] += int(count)
    return counts


def print_shares(heading: str, counts: Counter[str], cpu_us: float) -> None:
    """``heading``, then each place's share of the samples and its µs of ``cpu_us``."""
    total = counts.total()
    print(f"\n== {heading}; {total:,} samples ==")
    rows = [
        [name, f"{n / total:.1%}", f"{n / total * cpu_us:,.1f}"] for name, n in counts.most_common()
    ]
    print(table(["where", "share", "µs/request"], rows))


def print_budget(target: str, counts: Counter[str], cpu_us: float, rps: float) -> None:
    print_shares(
        f"{target}: {cpu_us:,.0f} µs of CPU per request at {rps:,.0f} req/s"
        " (wrk -c64, no profiler), under py-spy",
        counts,
        cpu_us,
    )


def profile(
    setup: Setup, wrk: str, target: str, duration: int, out: Path, mix: str = "chat"
) -> None:
    """The CPU per request (``mix``: ``chat`` or ``sse``, a stream of 24 events) without the
    profiler, then the budget under it, printed."""
    lane, path = MIXES[mix]
    url, pid = setup.url(target, lane, path), setup.pid(target, lane)
    run_wrk(wrk, url, BODIES[mix], 1, pid)  # warm-up
    plain = run_wrk(wrk, url, BODIES[mix], duration, pid)
    raw = out / f"{target}-{mix}.txt"
    with recording(CANDIDATES.bin("py-spy"), pid, raw):
        run_wrk(wrk, url, BODIES[mix], duration, pid)
    if not raw.exists():
        raise BenchError(f"py-spy wrote nothing for {target}: see {raw.with_suffix('.log')}")
    print_budget(target, budget(raw), plain.cpu_us, plain.rps)


def run(targets: tuple[str, ...], duration: int, out: Path, mix: str = "chat") -> None:
    wrk, nginx = ensure_tools()
    tools = ensure_venvs(("p-proto", *targets))  # py-spy lives in the candidates' venv
    raise_fd_limit()
    cores = Cores.split(pin=True)
    print(f"cores: {cores.describe()}")
    os.sched_setaffinity(0, cores.load)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpugate-bench-") as tmp, Processes(Path(tmp)) as procs:
        setup = start_all(procs, nginx, ("direct", *targets), cores, tools)
        for target in targets:
            profile(setup, wrk, target, duration, out, mix)
        procs.check()
    print(f"\nraw stacks: {out}")


IN_PROCESS = (  # (label, policy, endpoints, auth, mix)
    ("chat, open", "prefix_affinity", "2", "open", "chat"),
    ("SSE (one piece), open", "prefix_affinity", "2", "open", "sse"),
    ("chat, client key", "prefix_affinity", "2", "key", "chat"),
    ("SSE (one piece), client key", "prefix_affinity", "2", "key", "sse"),
    ("SSE, 24 events, key with limits", "prefix_affinity", "2", "key+limits", "sse, 24 events"),
)  # fmt: skip


def in_process(duration: int, out: Path) -> None:
    """gpugate's own code per request (``hotpath_micro.py --gateway-case``: the whole app, two
    endpoints, prefix_affinity, the upstream answering from memory) under py-spy, its µs from
    the same run, divided by :data:`OWN_RULES`."""
    py_spy = CANDIDATES.ensure().bin("py-spy")
    micro = Path(__file__).resolve().parent / "hotpath_micro.py"
    env = {**os.environ, "GPUGATE_ADMIN_TOKEN": "bench-" + "z" * 32}  # no warning per gateway
    for label, policy, endpoints, auth, mix in IN_PROCESS:
        raw = out / f"in-process-{len(list(out.glob('in-process-*')))}.txt"
        argv = [sys.executable, str(micro), "--gateway-case", policy, endpoints, auth, mix]
        record = [py_spy, "record", "-r", "1000", "-f", "raw", "-o", str(raw), "--", *argv]
        done = subprocess.run(
            [*record, str(duration)], capture_output=True, text=True, env=env, check=False
        )
        found = re.search(r"^US (.*)$", done.stdout, re.MULTILINE)
        if done.returncode != 0 or found is None or not raw.exists():
            raise BenchError(f"in-process profile of {label} failed:\n{done.stderr[-2000:]}")
        us = next(iter(json.loads(found[1]).values()))
        counts = budget(raw, OWN_RULES, within="_time_app")
        print_shares(
            f"{label}: {us:,.1f} µs of CPU per request in process (the collector tuned)", counts, us
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--targets", default="gpugate,p-proto")
    parser.add_argument("--out", type=Path, help="keep the raw stacks here")
    parser.add_argument(
        "--mix", choices=("chat", "sse"), default="chat", help="what wrk sends (chat)"
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="gpugate's own code per request, no transport (hotpath_micro.py --gateway-case)",
    )
    args = parser.parse_args()
    if args.in_process:
        out = args.out or Path(tempfile.mkdtemp(prefix="gpugate-profile-"))
        out.mkdir(parents=True, exist_ok=True)
        try:
            in_process(args.duration, out)
        except (BenchError, VenvError) as exc:
            print(f"profile: {exc}", file=sys.stderr)
            return 1
        return 0
    targets = tuple(t.strip() for t in args.targets.split(",") if t.strip())
    profiled = ("gpugate", "gpugate-asgi", "bare", *(t for t in PROTOTYPES if "rsgi" not in t))
    if unknown := [t for t in targets if t not in profiled]:
        print(f"profile: cannot profile {', '.join(unknown)}; any of {', '.join(profiled)}")
        return 2
    try:
        out = args.out or Path(tempfile.mkdtemp(prefix="gpugate-profile-"))
        run(targets, args.duration, out, args.mix)
    except (BenchError, VenvError) as exc:
        print(f"profile: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
