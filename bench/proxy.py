"""The proxy benchmark: gpugate against nginx and a bare uvicorn + aiohttp proxy, on loopback.

One run starts, each as its own process: a fake upstream (nginx answering canned OpenAI
responses), an nginx ``proxy_pass`` in front of it, the bare proxy (``bench/bare_proxy.py``),
gpugate, and two slow fake model servers (``gpugate.fleet``). It measures throughput (wrk),
added latency at a fixed rate (an open-loop client), time to first byte under 256 slow streams
and memory with 1,000 open streams, then prints the tables, the ratios and a Markdown summary
for BENCHMARKS.md. The machine is noisy: the ratios, measured in the same run, are the point.

    python bench/proxy.py [--duration 5] [--quick]

Exit status 1 when a target answered with errors or a phase could not finish.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Self

import aiohttp
import uvloop

HERE = Path(__file__).resolve().parent
TARGETS = ("direct", "nginx", "bare", "gpugate")
PROXIES = ("gpugate", "nginx", "bare")  # bare last: it relays on after its client has gone
LANES = ("json", "sse", "slow", "long")  # an upstream each; nginx and bare route by port
MODELS = {  # gpugate routes by model: model -> lane
    "json-model": "json",
    "emb-model": "json",
    "sse-model": "sse",
    "slow-model": "slow",
    "long-model": "long",
}
SLOW = (0.05, 23)  # chunk delay (s), chunks: a stream of ~1.2 s, for time to first byte
LONG = (1.0, 30)  # a stream of ~31 s, held open for the memory reading
MODEL_SERVERS = {"slow": ("slow-model", SLOW), "long": ("long-model", LONG)}
CHAT = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"
MIXES = {"chat": ("json", CHAT), "embeddings": ("json", EMBEDDINGS), "sse": ("sse", CHAT)}
JSON_HEADERS = {"Content-Type": "application/json"}
RATE = 500.0  # requests/s of the added-latency client
SERVER_LIFETIME_S = 3600  # a fake model server exits on its own after this, if orphaned


class BenchError(Exception):
    """The benchmark could not go on (a process died, a port never answered)."""


# -- what is sent and answered ------------------------------------------------------------------


def _dumps(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _request(model: str, *, stream: bool = False) -> bytes:
    messages = [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Why do keep-alive connections make proxies faster?"},
    ]
    doc: dict[str, object] = {"model": model, "messages": messages, "max_tokens": 128}
    return _dumps({**doc, "stream": True} if stream else doc)


BODIES = {
    "chat": _request("json-model"),
    "embeddings": _dumps({"model": "emb-model", "input": "The quick brown fox jumps."}),
    "sse": _request("sse-model", stream=True),
    "slow": _request("slow-model", stream=True),
    "long": _request("long-model", stream=True),
}


def chat_completion() -> bytes:
    """A realistic non-streaming ``chat.completion`` (~600 bytes)."""
    content = (
        "Keep-alive lets a client send many requests over one TCP connection, so each request "
        "skips the handshake and slow start; a proxy that pools its upstream connections pays "
        "neither on its own hop either, which saves latency and CPU on both ends."
    )
    message = {"role": "assistant", "content": content, "refusal": None}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
    usage = {"prompt_tokens": 31, "completion_tokens": 52, "total_tokens": 83}
    head = {"id": "chatcmpl-AbC9bench000000000000000001", "object": "chat.completion"}
    more = {"created": 1732900000, "model": "json-model", "system_fingerprint": "fp_bench01"}
    return _dumps({**head, **more, "choices": [choice], "usage": usage})


def embedding_list(dim: int = 384) -> bytes:
    """An OpenAI embedding ``list`` with one vector of ``dim`` floats (~5 KB)."""
    rng = random.Random(7)  # fixed filler numbers
    vector = [round(rng.uniform(-0.12, 0.12), 9) for _ in range(dim)]
    item = {"object": "embedding", "index": 0, "embedding": vector}
    usage = {"prompt_tokens": 6, "total_tokens": 6}
    return _dumps({"object": "list", "data": [item], "model": "emb-model", "usage": usage})


def sse_stream(events: int = 23) -> bytes:
    """``events`` ``chat.completion.chunk`` events and ``data: [DONE]`` (~4.5 KB)."""
    head = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1732900000}
    words = ["Keep-alive", "saves", "a", "handshake", "per", "request", "and", "connection"]
    out = []
    for i in range(events):
        delta = {"role": "assistant", "content": ""} if i == 0 else {}
        if 0 < i < events - 1:
            delta["content"] = words[i % len(words)] + " "
        finish = "stop" if i == events - 1 else None
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        out.append(b"data: " + _dumps({**head, "model": "sse-model", "choices": [choice]}))
    out.append(b"data: [DONE]")
    return b"".join(event + b"\n\n" for event in out)


# -- configurations -----------------------------------------------------------------------------


def nginx_return(body: bytes, part: int = 2000) -> str:
    """``return 200 <body>;``, the body set into variables part by part when it is longer than
    one token of an nginx config may be (4 KB)."""
    text = body.decode()
    assert "$" not in text, "nginx would read $ as a variable"
    parts = [text[i : i + part] for i in range(0, len(text), part)]
    quoted = [
        "'" + p.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'" for p in parts
    ]
    if len(quoted) == 1:
        return f"return 200 {quoted[0]};"
    sets = " ".join(f"set $part{i} {q};" for i, q in enumerate(quoted))
    return sets + ' return 200 "' + "".join(f"$part{i}" for i in range(len(parts))) + '";'


def nginx_conf(workdir: Path, name: str, http: str) -> str:
    return f"""daemon off;
worker_processes 1;
worker_rlimit_nofile 16384;
pid {workdir}/{name}.pid;
error_log {workdir}/{name}-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    client_body_temp_path {workdir}/{name}-body;
    proxy_temp_path {workdir}/{name}-proxy;
{http}
}}
"""


def fake_upstream_http(json_port: int, sse_port: int) -> str:
    """Two servers answering from memory: chat and embeddings as JSON; chat as SSE."""
    health = "location = /health { return 200 'ok'; }"
    return f"""
    server {{
        listen 127.0.0.1:{json_port} backlog=4096;
        default_type application/json;
        location = {CHAT} {{ {nginx_return(chat_completion())} }}
        location = {EMBEDDINGS} {{ {nginx_return(embedding_list())} }}
        {health}
    }}
    server {{
        listen 127.0.0.1:{sse_port} backlog=4096;
        location = {CHAT} {{ default_type text/event-stream; {nginx_return(sse_stream())} }}
        {health}
    }}"""


def nginx_proxy_http(routes: dict[int, int]) -> str:
    """A ``proxy_pass`` server per listening port to its upstream, keep-alive pooled, unbuffered."""
    return "".join(
        f"""
    upstream up{listen} {{ server 127.0.0.1:{up}; keepalive 64; keepalive_requests 1000000; }}
    server {{
        listen 127.0.0.1:{listen} backlog=4096;
        location / {{
            proxy_pass http://up{listen};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}"""
        for listen, up in routes.items()
    )


def gateway_yaml(workdir: Path, port: int, upstream_ports: dict[str, int]) -> str:
    lines = [f"listen: 127.0.0.1:{port}", f"store: sqlite:///{workdir}/bench.db", "upstreams:"]
    for model, lane in MODELS.items():
        url = f"http://127.0.0.1:{upstream_ports[lane]}"
        limits = "max_inflight: 4096, max_queue: 10000"  # admission never throttles the bench
        lines.append(f"  - {{id: {model}, url: '{url}', models: [{model}], {limits}}}")
    return "\n".join(lines) + "\n"


# -- processes ----------------------------------------------------------------------------------


class Processes:
    """The benchmark's child processes, each in its own session (Ctrl-C reaches only us);
    leaving the context ends each: SIGTERM, then SIGKILL of its process group."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, name: str, argv: list[str]) -> int:
        with (self.workdir / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._procs[name] = proc
        return proc.pid

    def check(self) -> None:
        """Raise if any process has exited, with the end of its log."""
        for name, proc in self._procs.items():
            if (code := proc.poll()) is not None:
                tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise BenchError(f"{name} exited with {code}:\n{tail}")

    def stop(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self._procs.clear()


def wait_http(procs: Processes, url: str, timeout_s: float = 30.0) -> None:
    """Poll ``url`` until it answers 200; every process must stay alive meanwhile."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no HTTP_PROXY
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs.check()
        try:
            with opener.open(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    raise BenchError(f"nothing answered 200 at {url} within {timeout_s:g} s")


def _proc_field(pid: int, name: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith(name + ":"))


def process_tree(pid: int) -> list[int]:
    """``pid`` and its children (an nginx master and its workers)."""
    children = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and _proc_field(int(entry.name), "PPid") == pid:
                children.append(int(entry.name))
        except (OSError, StopIteration):
            continue  # gone meanwhile, or a kernel thread
    return [pid, *children]


def rss_mb(pid: int) -> float:
    """The resident memory (VmRSS) of ``pid`` and its children, in MB."""
    return sum(_proc_field(each, "VmRSS") for each in process_tree(pid)) / 1024


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its children so far."""
    ticks = 0
    for each in process_tree(pid):
        fields = Path(f"/proc/{each}/stat").read_text().rpartition(")")[2].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


# -- the setup ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Setup:
    """The ports of every target per lane, and the process of each target."""

    ports: dict[str, dict[str, int]]  # target -> lane -> port
    pids: dict[str, int]  # target -> pid (for direct: the fake upstream nginx)

    def url(self, target: str, lane: str, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[target][lane]}{path}"


def start_all(procs: Processes, nginx: str) -> Setup:
    """Start every process, each on free ports, and wait until each answers."""
    ports = {t: {lane: free_port() for lane in LANES} for t in ("direct", "nginx", "bare")}
    ports["gpugate"] = dict.fromkeys(LANES, free_port())
    up, workdir = ports["direct"], procs.workdir
    pids = {
        "direct": _start_nginx(procs, nginx, "upstream", fake_upstream_http(up["json"], up["sse"]))
    }
    for lane, (model, (delay, chunks)) in MODEL_SERVERS.items():
        argv = [sys.executable, __file__, "--model-server", model, str(up[lane]), str(delay)]
        procs.start(lane, [*argv, str(chunks)])
    routes = {ports["nginx"][lane]: up[lane] for lane in LANES}
    pids["nginx"] = _start_nginx(procs, nginx, "nginx", nginx_proxy_http(routes))
    bare_routes = [f"--route={ports['bare'][lane]}=http://127.0.0.1:{up[lane]}" for lane in LANES]
    pids["bare"] = procs.start("bare", [sys.executable, str(HERE / "bare_proxy.py"), *bare_routes])
    (workdir / "gateway.yaml").write_text(gateway_yaml(workdir, ports["gpugate"]["json"], up))
    serve = ["serve", "--config", str(workdir / "gateway.yaml"), "--log-level", "WARNING"]
    pids["gpugate"] = procs.start("gpugate", [sys.executable, "-m", "gpugate", *serve])
    setup = Setup(ports, pids)
    for target in ("direct", "nginx", "bare"):
        for lane in LANES:
            wait_http(procs, setup.url(target, lane, "/health"))
    wait_http(procs, setup.url("gpugate", "json", "/readyz"))
    return setup


def _start_nginx(procs: Processes, nginx: str, name: str, http: str) -> int:
    conf = procs.workdir / f"{name}.conf"
    conf.write_text(nginx_conf(procs.workdir, name, http))
    error_log = procs.workdir / f"{name}-error.log"
    return procs.start(
        name, [nginx, "-c", str(conf), "-p", str(procs.workdir), "-e", str(error_log)]
    )


def serve_model(model: str, port: int, delay_s: float, chunks: int) -> None:
    """A slow fake model server (``gpugate.fleet``) on ``port``, until SIGTERM."""
    from gpugate.fleet import ModelServer, ServerBehaviour

    async def serve() -> None:
        behaviour = ServerBehaviour(chunk_delay_s=delay_s, chunks=chunks)
        server = ModelServer([model], name=model, behaviour=behaviour)
        await server.start("127.0.0.1", port)
        try:
            await asyncio.sleep(SERVER_LIFETIME_S)
        finally:
            await server.stop()

    uvloop.run(serve())


# -- throughput: wrk ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """One wrk run against one target."""

    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    non_2xx: int
    socket_errors: int
    cpu_us: float  # CPU of the target's process(es) per request


_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def parse_wrk(text: str, cpu: float) -> Load:
    """A :class:`Load` from wrk's output and the CPU seconds the target spent meanwhile."""

    def find(pattern: str) -> re.Match[str]:
        if (match := re.search(pattern, text, re.MULTILINE)) is None:
            raise BenchError(f"no {pattern!r} in wrk's output:\n{text}")
        return match

    p50, p99 = (find(rf"^\s+{q}%\s+([\d.]+)(us|ms|s|m)\s*$") for q in (50, 99))
    total = int(find(r"(\d+) requests in")[1])
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    sockets = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text
    )
    return Load(
        rps=float(find(r"Requests/sec:\s+([\d.]+)")[1]),
        p50_ms=float(p50[1]) * _UNITS_MS[p50[2]],
        p99_ms=float(p99[1]) * _UNITS_MS[p99[2]],
        requests=total,
        non_2xx=int(non_2xx[1]) if non_2xx else 0,
        socket_errors=sum(int(n) for n in sockets.groups()) if sockets else 0,
        cpu_us=cpu / max(total, 1) * 1e6,
    )


def run_wrk(wrk: str, url: str, body: bytes, duration: int, pid: int) -> Load:
    """``wrk -t1 -c64 --latency`` POSTing ``body`` (bench/post.lua); the target's CPU is read
    around the run."""
    argv = [wrk, "-t1", "-c64", f"-d{duration}s", "--latency", "-s", str(HERE / "post.lua"), url]
    env = {**os.environ, "BENCH_BODY": body.decode()}
    cpu_before = cpu_s(pid)
    done = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=duration + 60, check=False
    )
    if done.returncode != 0:
        raise BenchError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    return parse_wrk(done.stdout, cpu_s(pid) - cpu_before)


# -- the Python clients: open-loop latency, slow streams, held streams --------------------------


def pct(values: list[float], q: float) -> float:
    """The ``q``-th percentile by nearest rank (NaN when there is nothing)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _session(timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout)


@dataclass
class OpenLoop:
    """Non-streaming requests sent at a fixed rate, whatever the answers do."""

    latency_ms: list[float] = field(default_factory=list)
    overhead_ms: list[float] = field(default_factory=list)  # gpugate's X-Gateway-Overhead-Ms
    late_ms: list[float] = field(default_factory=list)  # how late the client sent each one
    sent_rps: float = 0.0
    errors: int = 0


async def _timed(session: aiohttp.ClientSession, url: str, body: bytes, into: OpenLoop) -> None:
    started = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
            await resp.read()
            elapsed_ms = (time.perf_counter() - started) * 1000
    except (aiohttp.ClientError, TimeoutError):
        into.errors += 1
        return
    if resp.status != 200:
        into.errors += 1
        return
    into.latency_ms.append(elapsed_ms)
    if (overhead := resp.headers.get("x-gateway-overhead-ms")) is not None:
        into.overhead_ms.append(float(overhead))


async def open_loop(url: str, body: bytes, rate: float, duration: float) -> OpenLoop:
    """Send at ``rate`` for ``duration`` s, after 0.5 s of the same that is not counted."""
    loop = asyncio.get_running_loop()
    async with _session(aiohttp.ClientTimeout(total=10)) as session:
        for seconds in (0.5, duration):
            result, tasks = OpenLoop(), []
            count = max(2, round(rate * seconds))
            start = loop.time() + 0.01
            for i in range(count):
                due = start + i / rate
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                result.late_ms.append((loop.time() - due) * 1000)
                tasks.append(asyncio.create_task(_timed(session, url, body, result)))
            result.sent_rps = (count - 1) / max(loop.time() - start, 1e-9)
            await asyncio.gather(*tasks)
    return result


@dataclass
class Streams:
    """Streams run by a fixed number of clients, each one stream after another."""

    ttfb_ms: list[float] = field(default_factory=list)
    errors: int = 0


async def _one_stream(session: aiohttp.ClientSession, url: str, body: bytes) -> float | None:
    """Time to the first body byte (ms) of one stream read to its end; None if it failed."""
    started = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
            first = await resp.content.readany()
            ttfb_ms = (time.perf_counter() - started) * 1000
            while await resp.content.readany():
                pass
    except (aiohttp.ClientError, TimeoutError):
        return None
    return ttfb_ms if resp.status == 200 and first else None


async def slow_streams(
    url: str, body: bytes, clients: int, warmup_s: float, duration: float
) -> Streams:
    """``clients`` loops streaming one answer after another, started spread over a stream's
    length; streams begun in the warm-up or after ``duration`` are not counted."""
    loop = asyncio.get_running_loop()
    counted_from = loop.time() + warmup_s
    deadline = counted_from + duration
    result = Streams()

    async def client(session: aiohttp.ClientSession, offset: float) -> None:
        await asyncio.sleep(offset)
        while (began := loop.time()) < deadline:
            ttfb_ms = await _one_stream(session, url, body)
            if began < counted_from:
                continue
            if ttfb_ms is None:
                result.errors += 1
            else:
                result.ttfb_ms.append(ttfb_ms)

    spread = SLOW[0] * (SLOW[1] + 1) if warmup_s else duration / 2
    async with _session(aiohttp.ClientTimeout(total=30)) as session:
        await asyncio.gather(*(client(session, i * spread / clients) for i in range(clients)))
    return result


@dataclass
class Held:
    """Long streams opened at once, held until each had its first chunk, then closed."""

    count: int
    opened: int = 0
    failed: int = 0
    open_s: float = math.nan  # until every stream had its first chunk
    rss_mb: float = math.nan  # of the proxy, with the streams open
    left_open: int = 0  # streams the upstream still served 5 s after the clients closed


async def hold_streams(
    url: str, body: bytes, count: int, read_rss: Callable[[], float], stats_url: str
) -> Held:
    """Open ``count`` long streams at once; when each has its first chunk (or after 60 s) read
    the RSS and close them all; then count the streams the upstream still serves."""
    loop = asyncio.get_running_loop()
    held, ready, release = Held(count), asyncio.Event(), asyncio.Event()

    def tally(*, ok: bool) -> None:
        held.opened += ok
        held.failed += not ok
        if held.opened + held.failed == count:
            ready.set()

    async def hold(session: aiohttp.ClientSession) -> None:
        counted = False
        try:
            async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
                tally(ok=resp.status == 200 and bool(await resp.content.readany()))
                counted = True
                await release.wait()
                resp.close()
        except (aiohttp.ClientError, TimeoutError):
            if not counted:
                tally(ok=False)

    started = loop.time()
    async with _session(aiohttp.ClientTimeout(sock_connect=30, sock_read=30)) as session:
        tasks = [asyncio.create_task(hold(session)) for _ in range(count)]
        await asyncio.wait([asyncio.create_task(ready.wait())], timeout=60)
        held.open_s, held.rss_mb = loop.time() - started, read_rss()
        release.set()
        _, stuck = await asyncio.wait(tasks, timeout=10)
        for task in stuck:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        held.left_open = await _upstream_streams(session, stats_url, timeout_s=5)
    return held


async def _upstream_streams(session: aiohttp.ClientSession, url: str, timeout_s: float) -> int:
    """The streams a fake model server still serves, once none or after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        async with session.get(url) as resp:
            left = int((await resp.json())["open_streams"])
        if left == 0 or asyncio.get_running_loop().time() > deadline:
            return left
        await asyncio.sleep(0.1)


# -- the phases ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    duration: int
    warmup: bool  # a 1 s wrk run before each measured one; a stream's length before TTFB
    ttfb_clients: int
    held: int


@dataclass
class Report:
    """Everything measured in one run."""

    machine: dict[str, str]
    settings: Settings
    loads: dict[str, dict[str, Load]] = field(default_factory=dict)  # mix -> target -> run
    latency: dict[str, OpenLoop] = field(default_factory=dict)
    ttfb: dict[str, Streams] = field(default_factory=dict)
    rss: dict[str, dict[str, float]] = field(default_factory=dict)  # target -> moment -> MB
    held: dict[str, Held] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(c) for c in col) for col in zip(headers, *rows, strict=True)]
    lines = [headers, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(ln, widths, strict=True)) for ln in lines)


def fmt(value: float, digits: int = 0) -> str:
    return "—" if math.isnan(value) else f"{value:,.{digits}f}"


def phase_throughput(setup: Setup, wrk: str, report: Report) -> None:
    duration = report.settings.duration
    print(f"\n== Throughput: wrk -t1 -c64 -d{duration}s --latency, POST ==", flush=True)
    rows = []
    for mix, (lane, path) in MIXES.items():
        for target in TARGETS:
            url, pid = setup.url(target, lane, path), setup.pids[target]
            if report.settings.warmup:
                run_wrk(wrk, url, BODIES[mix], 1, pid)
            load = run_wrk(wrk, url, BODIES[mix], duration, pid)
            report.loads.setdefault(mix, {})[target] = load
            rows.append([mix, target, fmt(load.rps), fmt(load.p50_ms, 2), fmt(load.p99_ms, 2)])
            rows[-1] += [fmt(load.cpu_us), str(load.non_2xx), str(load.socket_errors)]
            if load.non_2xx or load.socket_errors:
                errors = f"{load.non_2xx} non-2xx and {load.socket_errors} socket errors"
                report.problems.append(f"{mix} via {target}: {errors} (wrk)")
    headers = ["mix", "target", "req/s", "p50 ms", "p99 ms", "CPU µs/req", "non-2xx", "sock err"]
    print(table(headers, rows))
    ratios = [
        [mix, *(f"{loads['gpugate'].rps / loads[t].rps:.3f}" for t in ("direct", "nginx", "bare"))]
        for mix, loads in report.loads.items()
    ]
    print("\n" + table(["mix", "gpugate/direct", "gpugate/nginx", "gpugate/bare"], ratios))


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
    base = report.latency["direct"].latency_ms
    rows = []
    for target, r in report.latency.items():
        added = [
            "" if target == "direct" else f"{pct(r.latency_ms, q) - pct(base, q):+.2f}"
            for q in (50, 99)
        ]
        rows.append(
            [target, str(len(r.latency_ms)), fmt(r.sent_rps), fmt(pct(r.late_ms, 99), 2)]
            + [fmt(pct(r.latency_ms, q), 2) for q in (50, 99)]
            + [*added, str(r.errors)]
        )
    headers = ["target", "n", "sent/s", "late p99", "p50 ms", "p99 ms", "+p50", "+p99", "errors"]
    print(table(headers, rows))
    gw = report.latency["gpugate"].overhead_ms
    print(f"gpugate X-Gateway-Overhead-Ms: median {fmt(pct(gw, 50), 3)}, p99 {fmt(pct(gw, 99), 3)}")


def phase_ttfb(setup: Setup, report: Report) -> None:
    s = report.settings
    warmup_s = SLOW[0] * (SLOW[1] + 1) if s.warmup else 0.0
    delay_ms = SLOW[0] * 1000
    print(
        f"\n== Time to first byte: {s.ttfb_clients} concurrent slow streams ({SLOW[1]} chunks,"
        f" one per {delay_ms:g} ms) for {s.duration} s ==",
        flush=True,
    )
    rows = []
    for target in TARGETS:
        url, pid = setup.url(target, "slow", CHAT), setup.pids[target]
        cpu, wall = cpu_s(pid), time.monotonic()
        r = uvloop.run(slow_streams(url, BODIES["slow"], s.ttfb_clients, warmup_s, s.duration))
        busy = (cpu_s(pid) - cpu) / (time.monotonic() - wall) * 100
        report.ttfb[target] = r
        if r.errors or not r.ttfb_ms:
            report.problems.append(f"slow streams via {target}: {r.errors} failed")
        rows.append(
            [target, str(len(r.ttfb_ms)), fmt(len(r.ttfb_ms) / s.duration)]
            + [fmt(pct(r.ttfb_ms, q), 2) for q in (50, 99, 100)]
            + ["—" if target == "direct" else fmt(busy), str(r.errors)]
        )
    headers = ["target", "streams", "streams/s", "p50 ms", "p99 ms", "max ms", "CPU %", "errors"]
    print(table(headers, rows))


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
    rows = []
    for target in PROXIES:
        rss, held = report.rss[target], report.held[target]
        rows.append([target, *(fmt(rss[m], 1) for m in ("idle", "loaded", "streams"))])
        rows[-1] += [f"{held.opened}/{count}", fmt(held.open_s, 2), str(held.left_open)]
    headers = ["target", "idle MB", "after load MB", f"{count:,} streams MB", "opened", "open s"]
    print(table([*headers, "upstream streams left 5 s after close"], rows))


# -- the summary --------------------------------------------------------------------------------


def verdicts(r: Report) -> list[tuple[str, str, bool]]:
    """Each target: what it asks, what was measured, met or not."""
    chat, s = r.loads["chat"], r.settings
    gw = chat["gpugate"].rps
    direct = r.latency["direct"].latency_ms
    added = [pct(r.latency["gpugate"].latency_ms, q) - pct(direct, q) for q in (50, 99)]
    streams = r.loads["sse"]["gpugate"].rps
    ttfb = pct(r.ttfb["gpugate"].ttfb_ms, 99)
    rss = r.rss["gpugate"]["streams"]
    vs_bare, vs_nginx = gw / chat["bare"].rps, gw / chat["nginx"].rps
    return [
        ("≥ 6,000 req/s non-streaming chat at 64 conns", f"{gw:,.0f}", gw >= 6000),
        ("≥ 0.5 x the bare proxy (chat)", f"{vs_bare:.2f} x", vs_bare >= 0.5),
        ("≥ 0.1 x nginx (chat)", f"{vs_nginx:.2f} x", vs_nginx >= 0.1),
        (f"added latency p50 ≤ 1 ms at {RATE:g} req/s", f"{added[0]:+.2f} ms", added[0] <= 1),
        (f"added latency p99 ≤ 3 ms at {RATE:g} req/s", f"{added[1]:+.2f} ms", added[1] <= 3),
        ("≥ 4,000 fast streams/s", f"{streams:,.0f}", streams >= 4000),
        (f"TTFB p99 ≤ 10 ms with {s.ttfb_clients} slow streams", f"{ttfb:.2f} ms", ttfb <= 10),
        (f"RSS ≤ 100 MB with {s.held:,} open streams", f"{rss:.1f} MB", rss <= 100),
    ]


def _md(headers: list[str], rows: list[list[str]]) -> str:
    lines = [headers, ["---"] * len(headers), *rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def _pair(values: list[float], digits: int = 2) -> str:
    return " / ".join(fmt(v, digits) for v in values)


def summary_rows(r: Report) -> list[list[str]]:
    """The rows of the summary table: a measure, then each target, then gpugate's ratios."""
    rows = []
    for mix, label in (
        ("chat", "chat req/s"),
        ("embeddings", "embeddings req/s"),
        ("sse", "SSE streams/s"),
    ):
        loads = r.loads[mix]
        ratios = [f"{loads['gpugate'].rps / loads[t].rps:.3f}" for t in ("direct", "nginx", "bare")]
        rows.append([f"{label} @64 conns", *(fmt(loads[t].rps) for t in TARGETS), *ratios])
    chat, direct = r.loads["chat"], r.latency["direct"].latency_ms

    def per_target(
        label: str, cell: Callable[[str], str], targets: tuple[str, ...] = TARGETS
    ) -> None:
        rows.append([label, *(["—"] * (4 - len(targets))), *map(cell, targets), "", "", ""])

    per_target("chat p50 / p99 ms @64", lambda t: _pair([chat[t].p50_ms, chat[t].p99_ms]))
    per_target("chat CPU µs/req (target process)", lambda t: fmt(chat[t].cpu_us))
    latency = {t: [pct(r.latency[t].latency_ms, q) for q in (50, 99)] for t in TARGETS}
    per_target(f"latency p50 / p99 ms @{RATE:g} req/s", lambda t: _pair(latency[t]))
    added = {t: [latency[t][i] - pct(direct, q) for i, q in enumerate((50, 99))] for t in TARGETS}
    per_target("added p50 / p99 ms", lambda t: _pair(added[t]), ("nginx", "bare", "gpugate"))
    ttfb = {t: [pct(r.ttfb[t].ttfb_ms, q) for q in (50, 99)] for t in TARGETS}
    per_target(
        f"TTFB p50 / p99 ms, {r.settings.ttfb_clients} slow streams", lambda t: _pair(ttfb[t])
    )
    rss = {t: [r.rss[t][m] for m in ("idle", "loaded", "streams")] for t in PROXIES}
    label = f"RSS MB idle / after load / {r.settings.held:,} streams"
    per_target(label, lambda t: _pair(rss[t], 1), ("nginx", "bare", "gpugate"))
    return rows


def print_summary(r: Report) -> None:
    m = r.machine
    print("\n== Summary (Markdown, for BENCHMARKS.md) ==\n")
    print(
        f"{m['date']} · {m['nproc']} cores · Python {m['python']} · nginx {m['nginx']} ·"
        f" {m['wrk']} · {r.settings.duration} s per run, loopback, one process per target\n"
    )
    headers = ["", *TARGETS, "gpugate/direct", "gpugate/nginx", "gpugate/bare"]
    print(_md(headers, summary_rows(r)))
    print()
    print(_md(["target", "measured", ""], [[a, b, "✓" if ok else "✗"] for a, b, ok in verdicts(r)]))
    overhead = r.latency["gpugate"].overhead_ms
    print(
        f"\ngpugate's own `X-Gateway-Overhead-Ms` at {RATE:g} req/s: median"
        f" {fmt(pct(overhead, 50), 3)} ms, p99 {fmt(pct(overhead, 99), 3)} ms."
    )


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
