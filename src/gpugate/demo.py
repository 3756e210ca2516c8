"""``gpugate demo`` and ``gpugate fleet``: the simulated fleet, alone or behind a real gateway.

The demo runs the reference push worker too (runtime ``home-1``, in front of qwen-35b), so the
push path can be tried. It writes its config to ``<workdir>/demo.yaml`` (a real file, loaded
like any other) and starts from a fresh embedded SQLite store at ``<workdir>/demo.db`` each
time. Its GPU health polls every 2 s with batch shedding on, so a scenario (``--scenario``, see
:mod:`gpugate.demo_scenarios`) plays out in seconds while a newcomer watches the console.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import signal
from collections.abc import Sequence
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Self

from gpugate.config import load_config
from gpugate.demo_scenarios import SCENARIOS, Stage, play
from gpugate.errors import GpugateError
from gpugate.fleet import EXPORTER, Fleet, FleetSpec, HostLabel, demo_spec
from gpugate.listen import bind
from gpugate.server import serve_gateway
from gpugate.worker import WorkerSettings
from gpugate.worker.server import running_worker

log = logging.getLogger("gpugate.demo")

DEMO_TOKEN = "demo-admin-token"  # noqa: S105 - printed on purpose: it guards a loopback demo
WORKER_SECRET_ENV = "GPUGATE_DEMO_WORKER_SECRET"  # noqa: S105 - a variable's name
DEFAULT_PACE_S = 5.0  # how long a scenario holds each state for a watcher (``--pace``)
MAX_PACE_S = 600.0
TRAFFIC_EVERY_S = 0.5  # the background chat traffic while a scenario plays
FLEET_HOST = "127.0.0.1"  # the simulated fleet listens on loopback only
HOME_DAILY_CENTS = 2.0  # home-1's daily budget in the demo: over it after ~4 s of its GPU time


def fleet_spec(gpus: int = 2, host_label: HostLabel = "Hostname") -> FleetSpec:
    spec = demo_spec()
    exporter = dataclasses.replace(spec.exporter, host_label=host_label)
    return dataclasses.replace(spec, gpus=gpus, exporter=exporter)


def fleet_members(spec: FleetSpec) -> list[str]:
    """The fleet's members in the order fixed ports go to them: every server as the spec lists
    them, then the exporter."""
    return [*(server.name for server in spec.servers), EXPORTER]


def fleet_ports(spec: FleetSpec, ports: Sequence[int]) -> dict[str, int]:
    """Fixed ports for the fleet's members, in order (:func:`fleet_members`). One port is the
    first of consecutive ones; otherwise one per member."""
    members = fleet_members(spec)
    if len(ports) == 1:
        ports = [ports[0] + i for i in range(len(members))]
    if len(ports) != len(members):
        raise ValueError(
            f"--ports needs {len(members)} ports ({', '.join(members)}), got {len(ports)}"
        )
    if any(not 0 < port < 65536 for port in ports):
        raise ValueError(f"ports must be 1-65535, got {list(ports)}")
    return dict(zip(members, ports, strict=True))


async def run_fleet(
    *, gpus: int = 2, host_label: HostLabel = "Hostname", ports: Sequence[int] = ()
) -> None:
    """Run the simulated fleet until SIGINT or SIGTERM, printing where each member listens;
    ``ports`` fixes them (see :func:`fleet_ports`), else each gets a free one. Fixed ports are
    all bound first, so a taken one is a :class:`~gpugate.errors.ListenError` naming it."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    spec = fleet_spec(gpus, host_label)
    fixed = fleet_ports(spec, ports) if ports else {}
    with ExitStack() as bound:  # each socket is the fleet's once it serves; closed here if not
        socks = {name: bound.enter_context(bind(FLEET_HOST, port)) for name, port in fixed.items()}
        async with Fleet(spec, host=FLEET_HOST, ports=socks) as fleet:
            for line in fleet.describe():
                print(line, flush=True)  # noqa: T201 - the command's output
            print("Ctrl-C stops.", flush=True)  # noqa: T201
            await stop.wait()


def demo_config(
    fleet: Fleet, *, store: Path, listen: str, worker_url: str, access_log: bool = True
) -> str:
    """The demo gateway's YAML: the seed's upstreams on the simulated fleet's ports, and a push
    runtime ``home-1`` served by the demo's own push worker at ``worker_url``. A scenario turns
    the access log off (``access_log``): its background traffic would bury the narration."""
    s = fleet.servers
    access = "true" if access_log else "false  # a scenario plays: its narration is the output"
    return f"""\
# Written by `gpugate demo` for the simulated fleet started with it (ports change per run).
listen: {listen}
store: sqlite:///{store}
admin_token_env: GPUGATE_ADMIN_TOKEN

gpu_health:
  dcgm_url: {fleet.exporter.url}/metrics
  poll_s: 2
  staleness_s: 20
  sustained_samples: 3
  shed_batch: true        # on for the demo: `--scenario saturate` shows batch being shed

models:
  - name: qwen-35b
    fallbacks: [qwen-7b]    # `--scenario failover`: GPU 0 faults, the chat goes on on qwen-7b

upstreams:
  - id: qwen-35b
    url: {s["qwen-35b"].url}
    models: [qwen-35b]
    gpu_ids: [0]
  - id: qwen-7b
    url: {s["qwen-7b"].url}
    models: [qwen-7b]
    gpu_ids: [1]
    continuation: prefill   # it goes on after the text already delivered (a broken stream)
  - id: cleanup-3b
    url: {s["cleanup-3b"].url}
    models: [cleanup-3b]
    gpu_ids: [1]
  - id: tei-embeddings
    url: {s["tei-embeddings"].url}
    models: [bge-m3]
    gpu_ids: [1]
  - id: doc-classifier
    url: {s["doc-classifier"].url}
    models: [doc-classifier]
    gpu_ids: [1]

runtimes:
  - id: local
    kind: upstream
  - id: home-1              # a "home GPU": the demo's push worker, in front of qwen-35b
    kind: push
    models: [qwen-35b]
    push: {{url: {worker_url}/calls, secret_env: {WORKER_SECRET_ENV}}}
    max_concurrency: 2
    # a demo price and a tiny budget, so `--scenario budget` goes over it in seconds
    budget: {{daily_cents: {HOME_DAILY_CENTS:g}, cents_per_second: 1, estimate_s: 0.1}}
fallback_chain: [local, home-1]

server:
  shutdown_grace_s: 5
  console_sample_s: 2     # the console's charts move every 2 s in the demo
  access_log: {access}
"""


def banner(fleet: Fleet, *, url: str, workdir: Path, token: str) -> list[str]:
    """What the demo prints once it is up: where things are and what to try."""
    chat = '{"model":"qwen-35b","messages":[{"role":"user","content":"hello"}]}'
    stream = '{"model":"qwen-35b","stream":true,"messages":[{"role":"user","content":"hello"}]}'
    return [
        "",
        f"gpugate demo is up: {url}",
        f"  console      {url}/console    (log in with the admin token)",
        f"  admin token  {token}",
        f"  config  {workdir / 'demo.yaml'}    store  {workdir / 'demo.db'}",
        "  simulated fleet:",
        *(f"    {line}" for line in fleet.describe()),
        "",
        "Try:",
        f"  curl -s {url}/readyz",
        f"  curl -s {url}/v1/models",
        f"  curl -s {url}/v1/chat/completions -H 'content-type: application/json' -d '{chat}'",
        f"  curl -sN {url}/v1/chat/completions -H 'content-type: application/json' -d '{stream}'",
        (
            f"  curl -s {url}/v1/embeddings -H 'content-type: application/json'"
            ' -d \'{"model":"bge-m3","input":"hello"}\''
        ),
        (
            '  pip install openai && python -c "from openai import OpenAI; '
            f"c = OpenAI(base_url='{url}/v1', api_key='none'); "
            "print(c.chat.completions.create(model='qwen-35b', "
            "messages=[{'role': 'user', 'content': 'hi'}]).choices[0].message.content)\""
        ),
        (
            f"  curl -s {url}/v1/jobs -H 'content-type: application/json'"
            ' -d \'{"model":"qwen-35b","input":{"messages":[{"role":"user","content":"hi"}]}}\''
        ),
        (
            f"  curl -s {url}/v1/jobs -H 'content-type: application/json'"
            ' -d \'{"model":"qwen-35b","runner":"home-1",'
            '"input":{"messages":[{"role":"user","content":"hi"}]}}\'    (via the push worker)'
        ),
        f"  gpugate jobs list --gateway {url}",
        f"  curl -s {url}/admin/gpus -H 'Authorization: Bearer {token}'",
        f"  gpugate gpus inspect {fleet.exporter.metrics_url}",
        f"  curl -s {url}/metrics | grep ^gateway_requests_total",
        "",
        "Ctrl-C stops.",
    ]


def _fresh_store(workdir: Path) -> Path:
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "demo.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    return db


async def run_demo(
    host: str,
    port: int,
    *,
    workdir: Path,
    scenario: str | None = None,
    pace_s: float = DEFAULT_PACE_S,
) -> bool:
    """Gateway + simulated fleet until SIGINT/SIGTERM; True when it started and stopped cleanly.
    A ``scenario`` holds each of its states ``pace_s`` (see :func:`_play`)."""
    if scenario is not None and scenario not in SCENARIOS:
        raise GpugateError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
    if not 0 <= pace_s <= MAX_PACE_S:
        raise GpugateError(f"--pace must be between 0 and {MAX_PACE_S:g} seconds, not {pace_s:g}")
    environ = dict(os.environ)
    token = environ.setdefault("GPUGATE_ADMIN_TOKEN", DEMO_TOKEN)
    sock = bind(host, port)  # first, so a taken port fails before anything starts
    actual_port = sock.getsockname()[1]
    url = f"http://{host}:{actual_port}"
    db = await asyncio.to_thread(_fresh_store, workdir)
    secret = environ.setdefault(WORKER_SECRET_ENV, secrets.token_urlsafe(16))
    async with Fleet(fleet_spec()) as fleet, DemoWorker(fleet, url, secret, workdir) as worker:
        config_path = workdir / "demo.yaml"
        text = demo_config(
            fleet,
            store=db,
            listen=f"{host}:{actual_port}",
            worker_url=worker.url,
            access_log=scenario is None,
        )
        await asyncio.to_thread(config_path.write_text, text)
        config = load_config(config_path, environ=environ, require_env=True)

        plays: list[asyncio.Task[None]] = []

        async def announce() -> None:
            print("\n".join(banner(fleet, url=url, workdir=workdir, token=token)), flush=True)  # noqa: T201
            if scenario is not None:
                stage = stage_for(fleet, worker, url=url, token=token, pace_s=pace_s)
                plays.append(asyncio.create_task(_play(scenario, stage), name="demo-scenario"))

        try:
            return await serve_gateway(config, sock, environ=environ, on_started=announce)
        finally:
            for task in plays:
                task.cancel()
            await asyncio.gather(*plays, return_exceptions=True)


class DemoWorker:
    """The push worker of runtime ``home-1``: the reference worker, in front of qwen-35b.

    :meth:`restart` stops it and starts it again on the same port with another secret, as an
    operator does after editing its ``worker.env`` (``--scenario auth`` rotates it on the
    worker's side only, then puts the gateway's secret back).
    """

    def __init__(self, fleet: Fleet, gateway_url: str, secret: str, workdir: Path) -> None:
        self._settings = WorkerSettings(
            runtime_id="home-1",
            secret=secret,
            gateway_url=gateway_url,
            upstream_url=fleet.servers["qwen-35b"].url,
            state_dir=workdir / "worker-home-1",
            concurrency=2,
        )
        self._secret = secret
        self._stack = AsyncExitStack()
        self._port = 0
        self.url = ""

    async def _start(self, secret: str) -> None:
        settings = dataclasses.replace(self._settings, secret=secret)
        running = await self._stack.enter_async_context(
            running_worker(settings, "127.0.0.1", self._port)
        )
        self.url = running.url
        self._port = int(running.url.rsplit(":", 1)[1])

    async def restart(self, secret: str | None = None) -> None:
        """Stop the worker and start it again on its port with ``secret`` (None: the one the
        gateway holds)."""
        await self._stack.aclose()
        await self._start(self._secret if secret is None else secret)

    async def __aenter__(self) -> Self:
        await self._start(self._secret)
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._stack.aclose()


def stage_for(
    fleet: Fleet, worker: DemoWorker, *, url: str, token: str, pace_s: float = DEFAULT_PACE_S
) -> Stage:
    """The stage a scenario plays on: this gateway, this fleet's control routes, home-1's
    worker, stdout."""

    def say(line: str) -> None:
        print(line, flush=True)  # noqa: T201 - the scenario's narration is the demo's output

    return Stage(
        gateway_url=url,
        token=token,
        exporter_url=fleet.exporter.url,
        servers={name: server.url for name, server in fleet.servers.items()},
        say=say,
        restart_worker=worker.restart,
        pace_s=pace_s,
    )


async def _play(scenario: str, stage: Stage) -> None:
    """Play ``scenario`` for a watcher: steady chat traffic throughout (so the console's charts
    show the incident in requests, latency and errors), the healthy fleet held ``pace_s``
    before it starts and after it ends, each of its states held as it says."""
    stage.say(f"Playing scenario {scenario!r}: {SCENARIOS[scenario].shows}. Watch the console.")
    traffic = asyncio.create_task(_traffic(stage), name="demo-traffic")
    try:
        await stage.hold()
        await play(scenario, stage)
        await stage.hold()
    except GpugateError as exc:
        log.error("scenario %s stopped: %s", scenario, exc.message)  # noqa: TRY400 - no traceback helps
    finally:
        traffic.cancel()
        await asyncio.gather(traffic, return_exceptions=True)
    stage.say(f"[{scenario}] the background traffic stopped; the console keeps the last hour")


async def _traffic(stage: Stage) -> None:
    """One interactive chat request every :data:`TRAFFIC_EVERY_S`, to 127.0.0.1 only, until
    cancelled (the scenario ended): what the charts draw while an incident plays."""
    while True:
        await stage.chat()
        await asyncio.sleep(TRAFFIC_EVERY_S)
