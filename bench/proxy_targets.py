"""The proxy benchmark's targets: the processes it measures, their configuration and their ports.

A fake upstream (nginx answering canned OpenAI responses from memory), an nginx ``proxy_pass``
in front of it, vLLM's Rust router (``vllm-router`` from PyPI, in its own venv), the bare proxy
(``bench/bare_proxy.py``), gpugate, the hot-path prototypes when asked (``hotpath_*.py``, in the
candidates' venv), and two slow fake model servers (``gpugate.fleet``), each its own process on
free loopback ports. Also how the cores are split (:class:`Cores`: each proxy on a core of its
own, the load and the upstreams on the rest) and what a process costs: its resident memory and
CPU time, read from ``/proc``.
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
TARGETS = ("direct", "nginx", "vllm-router", "bare", "gpugate", "gpugate-p2c", "gpugate-asgi")
#: gpugate as configured by default (routing prefix_affinity), with wave 1's picker, served all
#: through ASGI (GPUGATE_FASTPATH=0: the data plane before the fast path, for A/B runs), at another
#: revision (``--baseline REV``: its own export and venv, no ``routing:``) and with two workers
#: (only when ``gpugate serve --help`` lists ``--workers``)
GATEWAYS: dict[str, str | None] = {
    "gpugate": "prefix_affinity",
    "gpugate-p2c": "least_outstanding",
    "gpugate-asgi": "prefix_affinity",
    "gpugate-base": None,
    "gpugate-x2": "prefix_affinity",
    "gpugate-gc": "prefix_affinity",  # the collector tuned once started (proxy_gc_serve.py)
}
_ENVIRONMENTS = {"gpugate-asgi": {"GPUGATE_FASTPATH": "0"}}
BASELINE, TWO_WORKERS = "gpugate-base", "gpugate-x2"
OPTIONAL = (BASELINE, "gpugate-gc")  # measured when asked for (--targets, --baseline)
#: The lanes whose fake upstream listens on two ports: every proxy in front of them is given both
#: as two endpoints (gpugate's urls, the router's workers, nginx's upstream servers), so routing's
#: scorer chooses between two on every request, as in a fleet (issue #18 done-when 4).
TWO_ENDPOINTS = ("json", "sse")
LANES = ("json", "sse", "slow", "long")  # an upstream each; nginx, the router and bare by port
# The hot-path prototypes (docs in bench/README.md): name -> script and its arguments.
PROTOTYPES: dict[str, tuple[str, ...]] = {
    "p-asgi-aiohttp": ("hotpath_apps.py", "--server", "uvicorn", "--client", "aiohttp"),
    "p-asgi-pyreqwest": ("hotpath_apps.py", "--server", "uvicorn", "--client", "pyreqwest"),
    "p-asgi-raw": ("hotpath_apps.py", "--server", "uvicorn", "--client", "raw"),
    "p-rsgi-aiohttp": ("hotpath_apps.py", "--server", "granian", "--client", "aiohttp"),
    "p-rsgi-raw": ("hotpath_apps.py", "--server", "granian", "--client", "raw"),
    "p-proto": ("hotpath_proto.py",),
    "p-proto-fast": ("hotpath_proto.py", "--parse", "msgspec", "--metrics", "cheap"),
    "p-proto-uvicorn": (
        "hotpath_proto.py",
        "--uvicorn",
        "--parse",
        "msgspec",
        "--metrics",
        "cheap",
    ),
    # two processes, each its own SO_REUSEPORT socket: for `proxy.py --workers` (unpinned)
    "p-proto-x2": ("hotpath_proto.py", "--workers", "2"),
    "p-proto-fast-x2": (
        "hotpath_proto.py",
        "--parse",
        "msgspec",
        "--metrics",
        "cheap",
        "--workers",
        "2",
    ),
}
ONE_CORE = tuple(name for name in PROTOTYPES if not name.endswith("-x2"))  # --candidates
WORKERS_RUN = ("vllm-router", "gpugate", "p-proto", "p-proto-x2", "p-proto-fast", "p-proto-fast-x2")
BY_PORT = ("nginx", "vllm-router", "bare")  # a listening port per lane; the rest route by model
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


def second(lane: str) -> str:
    """The name of a lane's second listening port in ``Setup.ports["direct"]``."""
    return lane + "-b"


def upstream_urls(up: dict[str, int], lane: str) -> list[str]:
    """The fake upstream's endpoints for ``lane``: two distinct ports where it has them."""
    ports = [up[lane], up[second(lane)]] if second(lane) in up else [up[lane]]
    return [f"http://127.0.0.1:{port}" for port in ports]


def fake_upstream_http(json_port: int, sse_port: int, json_b: int, sse_b: int) -> str:
    """Two servers answering from memory: chat and embeddings as JSON; chat as SSE; each on two
    ports (two endpoints of one upstream, to whoever is in front)."""
    health = "location = /health { return 200 'ok'; }"
    return f"""
    server {{
        listen 127.0.0.1:{json_port} backlog=4096;
        listen 127.0.0.1:{json_b} backlog=4096;
        default_type application/json;
        location = {CHAT} {{ {nginx_return(chat_completion())} }}
        location = {EMBEDDINGS} {{ {nginx_return(embedding_list())} }}
        {health}
    }}
    server {{
        listen 127.0.0.1:{sse_port} backlog=4096;
        listen 127.0.0.1:{sse_b} backlog=4096;
        location = {CHAT} {{ default_type text/event-stream; {nginx_return(sse_stream())} }}
        {health}
    }}"""


def nginx_proxy_http(routes: dict[int, list[int]]) -> str:
    """A ``proxy_pass`` server per listening port to its upstream's ports (round robin),
    keep-alive pooled, unbuffered."""
    return "".join(
        f"""
    upstream up{listen} {{ {" ".join(f"server 127.0.0.1:{p};" for p in up)} keepalive 64;
        keepalive_requests 1000000; }}
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


def gateway_yaml(
    workdir: Path, port: int, upstream_ports: dict[str, int], policy: str | None = "prefix_affinity"
) -> str:
    """gpugate's config for the bench; ``policy`` None: no ``routing:`` (a revision before it)."""
    lines = [f"listen: 127.0.0.1:{port}", f"store: sqlite:///{workdir}/{port}.db", "upstreams:"]
    for model, lane in MODELS.items():
        urls = ", ".join(f"'{url}'" for url in upstream_urls(upstream_ports, lane))
        limits = "max_inflight: 4096, max_queue: 10000"  # admission never throttles the bench
        routing = "" if policy is None else f", routing: {{policy: {policy}}}"
        lines.append(f"  - {{id: {model}, urls: [{urls}], models: [{model}], {limits}{routing}}}")
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

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        with (self.workdir / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )
        self._procs[name] = proc
        return proc.pid

    def check(self) -> None:
        """Raise if any process has exited, with the end of its log."""
        for name, proc in self._procs.items():
            if (code := proc.poll()) is not None:
                log = (self.workdir / f"{name}.log").read_text(errors="replace")
                panics = [ln for ln in log.splitlines() if "panicked at" in ln][:3]  # Rust
                raise BenchError(
                    f"{name} exited with {code}:\n" + "\n".join([*panics, log[-2000:]])
                )

    def stop_one(self, name: str) -> None:
        """End ``name`` alone (SIGTERM, then SIGKILL of its group) and forget it."""
        proc = self._procs.pop(name)
        proc.terminate()
        _reap(proc)

    def stop(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs.values():
            _reap(proc)
        self._procs.clear()


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Wait for a process told to end; after 5 s, SIGKILL its process group."""
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


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


# -- cores --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cores:
    """Which CPUs the proxies get and which the load (wrk, the Python clients, the fake
    upstreams): each proxy alone on its core, when there are at least two."""

    proxy: frozenset[int]
    load: frozenset[int]

    @classmethod
    def split(cls, *, pin: bool) -> Cores:
        cpus = sorted(os.sched_getaffinity(0))
        if not pin or len(cpus) < 2:
            return cls(frozenset(cpus), frozenset(cpus))
        return cls(frozenset(cpus[-1:]), frozenset(cpus[:-1]))

    @property
    def pinned(self) -> bool:
        return self.proxy != self.load

    def describe(self) -> str:
        if not self.pinned:
            return f"not pinned: every process may run on CPUs {_cpus(self.load)}"
        return (
            f"each proxy pinned to CPU {_cpus(self.proxy)} (taskset), alone while measured;"
            f" the load (wrk, the Python clients) and the fake upstreams on CPU {_cpus(self.load)}"
        )

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run on the proxy's CPUs."""
        return ["taskset", "-c", _cpus(self.proxy), *argv] if self.pinned else argv


def _cpus(cpus: frozenset[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


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
    """The targets of this run, their ports per lane and their processes per lane."""

    targets: tuple[str, ...]
    ports: dict[str, dict[str, int]]  # target -> lane -> port
    pids: dict[str, dict[str, int]]  # target -> lane -> pid (for direct: the fake upstream)
    cores: Cores

    def url(self, target: str, lane: str, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[target][lane]}{path}"

    def pid(self, target: str, lane: str = "json") -> int:
        """The process serving ``target``'s ``lane`` (one per lane for the router)."""
        return self.pids[target][lane]

    @property
    def proxies(self) -> tuple[str, ...]:
        """The targets that proxy, bare last (it relays on after its client has gone)."""
        ordered = [t for t in self.targets if t not in ("direct", "bare")]
        return (*ordered, "bare") if "bare" in self.targets else tuple(ordered)


def all_ports(targets: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """Free ports: one per lane for direct (and a second one for :data:`TWO_ENDPOINTS`) and
    for the targets routed by port; one for each of the others."""
    ports = {t: {lane: free_port() for lane in LANES} for t in ("direct", *BY_PORT)}
    for lane in TWO_ENDPOINTS:
        ports["direct"][second(lane)] = free_port()
    for target in targets:
        if target not in ports:
            ports[target] = dict.fromkeys(LANES, free_port())
    return ports


def start_all(
    procs: Processes, nginx: str, targets: tuple[str, ...], cores: Cores, tools: Tools
) -> Setup:
    """Start every process, each on free ports, and wait until each answers. The fake
    upstreams start on the load's CPUs; each proxy on the proxies' CPUs."""
    ports = all_ports(targets)
    up, workdir = ports["direct"], procs.workdir
    upstream = fake_upstream_http(up["json"], up["sse"], up[second("json")], up[second("sse")])
    pids = {"direct": dict.fromkeys(LANES, _start_nginx(procs, nginx, "upstream", upstream))}
    for lane, (model, (delay, chunks)) in MODEL_SERVERS.items():
        argv = [sys.executable, str(HERE / "proxy.py"), "--model-server", model, str(up[lane])]
        procs.start(lane, [*argv, str(delay), str(chunks)])
    for target in targets:
        if target == "nginx":
            routes = {
                ports["nginx"][lane]: [int(u.rpartition(":")[2]) for u in upstream_urls(up, lane)]
                for lane in LANES
            }
            pid = _start_nginx(procs, nginx, "nginx", nginx_proxy_http(routes), cores)
            pids["nginx"] = dict.fromkeys(LANES, pid)
        elif target == "vllm-router":
            pids[target] = {
                lane: procs.start(
                    f"vllm-router-{lane}",
                    cores.wrap(router_argv(tools, port, upstream_urls(up, lane))),
                )
                for lane, port in ports[target].items()
            }
        elif target == "bare":
            bare = [f"--route={ports['bare'][lane]}=http://127.0.0.1:{up[lane]}" for lane in LANES]
            argv = [sys.executable, str(HERE / "bare_proxy.py"), *bare]
            pids["bare"] = dict.fromkeys(LANES, procs.start("bare", cores.wrap(argv)))
        elif target in GATEWAYS:
            argv = gateway_argv(target, workdir, ports[target]["json"], up, tools)
            env = {**os.environ, **_ENVIRONMENTS[target]} if target in _ENVIRONMENTS else None
            if target == BASELINE:  # that revision's own gpugate, never a PYTHONPATH's
                env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            pids[target] = dict.fromkeys(LANES, procs.start(target, cores.wrap(argv), env=env))
        elif target in PROTOTYPES:
            argv = prototype_argv(tools, target, ports[target]["json"], up)
            pid = procs.start(target, cores.wrap(argv), env=tools.candidate_env)
            pids[target] = dict.fromkeys(LANES, pid)
    setup = Setup(targets, ports, pids, cores)
    for target in ("direct", *targets):
        for lane in LANES if target in ("direct", *BY_PORT) else ("json",):
            health = "/readyz" if target in GATEWAYS else "/health"
            wait_http(procs, setup.url(target, lane, health), timeout_s=60)
    return setup


@dataclass(frozen=True)
class Tools:
    """Where the programs outside gpugate's venv are: the router and the prototypes' python."""

    vllm_router: str | None
    candidates_python: str | None
    candidate_env: dict[str, str] | None
    #: ``--baseline REV``: the python of that revision's own venv (its gpugate installed)
    baseline_python: str | None = None


def gateway_argv(
    target: str, workdir: Path, port: int, up: dict[str, int], tools: Tools
) -> list[str]:
    """``gpugate serve`` for ``target`` (its config written), with this venv's gpugate or, for
    the baseline, the baseline venv's."""
    config = workdir / f"{target}.yaml"
    config.write_text(gateway_yaml(workdir, port, up, GATEWAYS[target]))
    serve = ["serve", "--config", str(config), "--log-level", "WARNING"]
    if target == TWO_WORKERS:
        serve += ["--workers", "2"]
    python = sys.executable
    if target == BASELINE:
        assert tools.baseline_python is not None
        python = tools.baseline_python
    if target == "gpugate-gc":
        return [python, str(HERE / "proxy_gc_serve.py"), *serve]
    return [python, "-m", "gpugate", *serve]


def router_argv(tools: Tools, port: int, urls: list[str]) -> list[str]:
    """vllm-router in front of one upstream's endpoints, round robin (it forwards every request
    to its workers whatever the model: one router per lane)."""
    assert tools.vllm_router is not None
    return [
        tools.vllm_router,
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--worker-urls", *urls, "--policy", "round_robin"),
        *("--worker-startup-check-interval", "1", "--prometheus-port", str(free_port())),
        *("--log-level", "warning"),
    ]


def prototype_argv(tools: Tools, name: str, port: int, up: dict[str, int]) -> list[str]:
    """A hot-path prototype on ``port``, routing each model to its lane's upstream."""
    assert tools.candidates_python is not None
    script, *args = PROTOTYPES[name]
    routes = [f"--route={model}=127.0.0.1:{up[lane]}" for model, lane in MODELS.items()]
    return [tools.candidates_python, str(HERE / script), "--port", str(port), *routes, *args]


def _start_nginx(
    procs: Processes, nginx: str, name: str, http: str, cores: Cores | None = None
) -> int:
    conf = procs.workdir / f"{name}.conf"
    conf.write_text(nginx_conf(procs.workdir, name, http))
    error_log = procs.workdir / f"{name}-error.log"
    argv = [nginx, "-c", str(conf), "-p", str(procs.workdir), "-e", str(error_log)]
    return procs.start(name, cores.wrap(argv) if cores else argv)


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
