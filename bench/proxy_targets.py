"""The proxy benchmark's targets: the processes it measures, their configuration and their ports.

A fake upstream (nginx answering canned OpenAI responses from memory), an nginx ``proxy_pass``
in front of it, the bare proxy (``bench/bare_proxy.py``), gpugate, and two slow fake model
servers (``gpugate.fleet``), each its own process on free loopback ports. Also what a process
costs: its resident memory and CPU time, read from ``/proc``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Self

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
SERVER_LIFETIME_S = 3600  # a fake model server exits on its own after this, if orphaned


class BenchError(Exception):
    """The benchmark could not go on (a process died, a port never answered)."""


# -- what the fake upstream answers -------------------------------------------------------------


def dumps(doc: object) -> bytes:
    """``doc`` as compact JSON."""
    return json.dumps(doc, separators=(",", ":")).encode()


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
    return dumps({**head, **more, "choices": [choice], "usage": usage})


def embedding_list(dim: int = 384) -> bytes:
    """An OpenAI embedding ``list`` with one vector of ``dim`` floats (~5 KB)."""
    rng = random.Random(7)  # fixed filler numbers
    vector = [round(rng.uniform(-0.12, 0.12), 9) for _ in range(dim)]
    item = {"object": "embedding", "index": 0, "embedding": vector}
    usage = {"prompt_tokens": 6, "total_tokens": 6}
    return dumps({"object": "list", "data": [item], "model": "emb-model", "usage": usage})


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
        out.append(b"data: " + dumps({**head, "model": "sse-model", "choices": [choice]}))
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
        argv = [sys.executable, str(HERE / "proxy.py"), "--model-server", model, str(up[lane])]
        procs.start(lane, [*argv, str(delay), str(chunks)])
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
    """A slow fake model server (``gpugate.fleet``) on ``port``, until SIGTERM; run in a child
    process as ``bench/proxy.py --model-server MODEL PORT DELAY CHUNKS``."""
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
