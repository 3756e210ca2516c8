"""The soak (issue #15 done-when 3): ``gpugate serve`` under mixed traffic and garbage for a while,
then the proof that nothing it holds grew without bound.

    python bench/soak.py                  # 600 s (the issue's 10 minutes)
    python bench/soak.py --quick          # 60 s
    python bench/soak.py --duration 120 --store postgresql://postgres@127.0.0.1:5432/soak

One ``gpugate serve`` process (SQLite in a temporary directory unless ``--store``) in front of
a fake model server (:class:`gpugate.fleet.ModelServer`, in this process, on loopback), with
retention shortened for the run (``retention.*`` 20 s, purged every 5 s; idempotency kept 20 s),
so the purge loop works many times over. The load, at a moderate rate (``--rate`` requests per
second in all, default 40), picks at random among:

* chat completions (some with an ``Idempotency-Key``, some naming unknown models), streams;
* jobs (``POST /v1/jobs``, some with ``?wait=``), each polled until it ends;
* batches: a 5-line file uploaded and run (one line names an unknown model);
* garbage: random bytes as bodies, broken and deep JSON, random paths under ``/u/`` with dot
  segments and encoded slashes, random ``X-Request-Class``, over-long headers, a request that
  stops halfway (header or body), oversized bodies — over a raw socket.

Printed at the start (after ``/readyz``), after one retention window (the *warm* mark: the
purge is now deleting as fast as traffic adds) and at the end: the gateway's RSS and open file
descriptors (from ``/proc``), the size of ``/metrics``, and every table's row count. The run
fails (exit 1) unless, from the warm mark to the end, RSS grew by less than 25% + 20 MiB, open
fds by less than 20, ``/metrics`` by less than 20%, and every table holds at most twice its warm
count + 50 rows; and no request got a 500.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from gpugate.clock import SystemClock
from gpugate.fleet import ModelServer, ServerBehaviour
from gpugate.store.factory import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_targets import Processes, free_port

MODEL = "soak-model"
RETENTION_S = 20
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}


def gateway_yaml(port: int, dsn: str, upstream_url: str, blobs: Path) -> str:
    return f"""
listen: 127.0.0.1:{port}
store: '{dsn}'
blobs: {{dir: '{blobs}'}}
upstreams:
  - {{id: soak, url: '{upstream_url}', models: [{MODEL}], max_inflight: 64, max_queue: 256}}
server:
  idempotency_ttl_s: {RETENTION_S}
  max_body_bytes: 1048576
  header_timeout_s: 5
  body_timeout_s: 5
retention: {{jobs_s: {RETENTION_S}, audit_s: {RETENTION_S}, batches_s: {RETENTION_S},
             every_s: 5, batch_rows: 200}}
"""


@dataclass
class Sample:
    label: str
    rss_kib: int
    fds: int
    metrics_bytes: int
    tables: dict[str, int]


@dataclass
class Tally:
    statuses: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    five_hundreds: list[str] = field(default_factory=list)

    def saw(self, kind: str, status: int | str) -> None:
        self.kinds[kind] += 1
        self.statuses[f"{kind}:{status}"] += 1
        if status == 500:
            self.five_hundreds.append(kind)


def proc_figures(pid: int) -> tuple[int, int]:
    """RSS (KiB) and open file descriptors of ``pid``."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return rss, sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())


async def sample(label: str, pid: int, base: str, dsn: str, http: aiohttp.ClientSession) -> Sample:
    rss, fds = proc_figures(pid)
    async with http.get(base + "/metrics") as resp:
        metrics = len(await resp.read())
    store = open_store(dsn, clock=SystemClock())
    await store.open()
    try:
        tables = await store.table_counts()
    finally:
        await store.close()
    return Sample(label, rss, fds, metrics, tables)


# --- the traffic ---------------------------------------------------------------------------


async def chat(http: aiohttp.ClientSession, base: str, tally: Tally, rng: random.Random) -> None:
    body = dict(CHAT)
    headers = {}
    roll = rng.random()
    if roll < 0.2:
        body["model"] = f"nobody-{rng.getrandbits(64):x}"  # an unknown model: one label value
    elif roll < 0.4:
        headers["Idempotency-Key"] = f"soak-{rng.getrandbits(32):x}"
    async with http.post(base + "/v1/chat/completions", json=body, headers=headers) as resp:
        await resp.read()
        tally.saw("chat", resp.status)


async def stream(http: aiohttp.ClientSession, base: str, tally: Tally, rng: random.Random) -> None:
    body = {**CHAT, "stream": True}
    async with http.post(base + "/v1/chat/completions", json=body) as resp:
        if rng.random() < 0.2:  # a client that leaves mid-stream
            await resp.content.readany()
            resp.close()
            tally.saw("stream-left", resp.status)
            return
        await resp.read()
        tally.saw("stream", resp.status)


async def job(http: aiohttp.ClientSession, base: str, tally: Tally, rng: random.Random) -> None:
    body = {"model": MODEL, "input": {"messages": CHAT["messages"]}}
    wait = "?wait=5" if rng.random() < 0.3 else ""
    headers = {"Idempotency-Key": f"job-{rng.getrandbits(48):x}"} if rng.random() < 0.5 else {}
    async with http.post(base + "/v1/jobs" + wait, json=body, headers=headers) as resp:
        doc = await resp.json(content_type=None)
        tally.saw("job", resp.status)
    slug = doc.get("slug") if isinstance(doc, dict) else None
    deadline = time.monotonic() + 20
    while slug and time.monotonic() < deadline:
        async with http.get(f"{base}/v1/jobs/{slug}") as resp:
            state = (await resp.json(content_type=None)).get("state")
            if resp.status == 404:  # purged already (retention is short): it had ended
                return
        if state in ("completed", "failed", "cancelled"):
            tally.saw("job-ended", state)
            return
        await asyncio.sleep(0.2)


async def batch(http: aiohttp.ClientSession, base: str, tally: Tally, rng: random.Random) -> None:
    lines = []
    for n in range(5):
        model = MODEL if n else "nobody-serves-this"
        line = {"custom_id": f"l{n}", "method": "POST", "url": "/v1/chat/completions"}
        lines.append(json.dumps({**line, "body": {**CHAT, "model": model}}))
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", ("\n".join(lines) + "\n").encode(), filename="in.jsonl")
    async with http.post(base + "/v1/files", data=form) as resp:
        uploaded = await resp.json(content_type=None)
        tally.saw("file", resp.status)
    if rng.random() < 0.2:  # an upload no batch ever names: purged as unused
        return
    create = {
        "input_file_id": uploaded.get("id"),
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    async with http.post(base + "/v1/batches", json=create) as resp:
        await resp.read()
        tally.saw("batch", resp.status)


_GARBAGE_TARGETS = (
    "/u/soak/../../etc/passwd",
    "/u/soak/x%2F..%2F..%2Fsecret",
    "/u/soak/v1/models%3Fq",
    "/u/nope/v1/models",
    "/v1/chat/completions",
    "/v1/jobs",
    "/v1/jobs/%00",
    "/v1/batches",
    "/admin/config",
    "/no/such/route",
)


async def garbage(base: str, tally: Tally, rng: random.Random) -> None:
    """One hostile request over a raw socket; the status (or how the connection ended)."""
    host, port = base.removeprefix("http://").split(":")
    target = rng.choice(_GARBAGE_TARGETS)
    kind = rng.choice(["bytes", "json", "deep", "class", "header", "half-head", "half-body", "big"])
    body = b""
    extra = ""
    if kind == "bytes":
        body = rng.randbytes(rng.randint(1, 2048))
    elif kind == "json":
        body = b'{"model": "' + rng.randbytes(8).hex().encode() + b'", "messages": [}'
    elif kind == "deep":
        body = b"[" * 5000 + b"]" * 5000
    elif kind == "class":
        extra = f"X-Request-Class: {rng.getrandbits(40):x}\r\n"
        body = json.dumps(CHAT).encode()
    elif kind == "header":
        extra = "X-Long: " + "a" * 70000 + "\r\n"
    elif kind == "big":
        extra = "Content-Length: 5000000\r\n"
    head = f"POST {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{extra}"
    if kind not in ("big", "half-body"):
        head += f"Content-Length: {len(body)}\r\n"
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        if kind == "half-head":
            writer.write(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        elif kind == "half-body":
            writer.write((head + "Content-Length: 1000\r\n\r\n").encode() + b'{"model":')
        else:
            writer.write(head.encode() + b"\r\n" + body)
        with contextlib.suppress(OSError):
            await writer.drain()
        async with asyncio.timeout(15):
            status_line = await reader.readline()
            with contextlib.suppress(OSError):
                await reader.read()
        parts = status_line.split()
        tally.saw(f"garbage-{kind}", int(parts[1]) if len(parts) > 1 else "closed")
    except (OSError, TimeoutError) as exc:
        tally.saw(f"garbage-{kind}", type(exc).__name__)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def one(http: aiohttp.ClientSession, base: str, tally: Tally, rng: random.Random) -> None:
    roll = rng.random()
    try:
        if roll < 0.35:
            await chat(http, base, tally, rng)
        elif roll < 0.55:
            await stream(http, base, tally, rng)
        elif roll < 0.75:
            await job(http, base, tally, rng)
        elif roll < 0.82:
            await batch(http, base, tally, rng)
        else:
            await garbage(base, tally, rng)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        tally.saw("client-error", type(exc).__name__)


async def load(base: str, rate: float, until: float, tally: Tally, seed: int) -> None:
    """Start requests at ``rate`` per second until ``until``; at most 200 at once."""
    rng = random.Random(seed)
    limit = asyncio.Semaphore(200)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as http:
        running: set[asyncio.Task[None]] = set()

        async def bounded() -> None:
            async with limit:
                await one(http, base, tally, rng)

        while time.monotonic() < until:
            task = asyncio.create_task(bounded())
            running.add(task)
            task.add_done_callback(running.discard)
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.wait_for(asyncio.gather(*running, return_exceptions=True), 60)


async def wait_ready(base: str, procs: Processes) -> None:
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession(trust_env=False) as http:
        while time.monotonic() < deadline:
            procs.check()
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(base + "/readyz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise SystemExit("the gateway never became ready")


def show(samples: list[Sample]) -> None:
    names = sorted({t for s in samples for t in s.tables})
    print(f"{'':22}" + "".join(f"{s.label:>12}" for s in samples))
    rows = [
        ("RSS (MiB)", [f"{s.rss_kib / 1024:.1f}" for s in samples]),
        ("open fds", [str(s.fds) for s in samples]),
        ("/metrics (KiB)", [f"{s.metrics_bytes / 1024:.1f}" for s in samples]),
        *((f"rows: {t}", [str(s.tables.get(t, 0)) for s in samples]) for t in names),
    ]
    for name, values in rows:
        print(f"{name:22}" + "".join(f"{v:>12}" for v in values))


def verdicts(warm: Sample, end: Sample, tally: Tally) -> list[str]:
    """What is not bounded (empty: the run passed)."""
    bad = []
    if end.rss_kib > warm.rss_kib * 1.25 + 20 * 1024:
        bad.append(f"RSS grew from {warm.rss_kib} KiB to {end.rss_kib} KiB")
    if end.fds > warm.fds + 20:
        bad.append(f"open fds grew from {warm.fds} to {end.fds}")
    if end.metrics_bytes > warm.metrics_bytes * 1.2:
        bad.append(f"/metrics grew from {warm.metrics_bytes} to {end.metrics_bytes} bytes")
    for table, rows in end.tables.items():
        if rows > 2 * warm.tables.get(table, 0) + 50:
            bad.append(f"table {table} grew from {warm.tables.get(table, 0)} to {rows} rows")
    if tally.five_hundreds:
        bad.append(f"{len(tally.five_hundreds)} answers were 500: {Counter(tally.five_hundreds)}")
    return bad


async def soak(duration_s: float, rate: float, store: str | None, seed: int) -> int:
    with tempfile.TemporaryDirectory(prefix="gpugate-soak-") as tmp, Processes(Path(tmp)) as procs:
        workdir = Path(tmp)
        dsn = store or f"sqlite:///{workdir / 'soak.db'}"
        behaviour = ServerBehaviour(delay_s=0.01, chunk_delay_s=0.005, chunks=4)
        async with ModelServer([MODEL], name="soak-upstream", behaviour=behaviour) as upstream:
            port = free_port()
            config = workdir / "gateway.yaml"
            config.write_text(gateway_yaml(port, dsn, upstream.url, workdir / "blobs"))
            argv = [sys.executable, "-m", "gpugate", "serve", "--config", str(config)]
            pid = procs.start("gateway", [*argv, "--log-level", "WARNING"])
            base = f"http://127.0.0.1:{port}"
            await wait_ready(base, procs)
            tally = Tally()
            started = time.monotonic()
            warm_at = started + min(duration_s / 2, 3 * RETENTION_S)
            until = started + duration_s
            async with aiohttp.ClientSession(trust_env=False) as http:
                samples = [await sample("start", pid, base, dsn, http)]
                traffic = asyncio.create_task(load(base, rate, until, tally, seed))
                await asyncio.sleep(max(0.0, warm_at - time.monotonic()))
                samples.append(await sample("warm", pid, base, dsn, http))
                await traffic
                procs.check()
                samples.append(await sample("end", pid, base, dsn, http))
            elapsed = time.monotonic() - started
    total = sum(tally.kinds.values())
    print(f"soak: {elapsed:.0f} s, {total} requests ({total / elapsed:.1f}/s), seed {seed}")
    print("by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.kinds.items())))
    print("answers: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.statuses.items())))
    show(samples)
    bad = verdicts(samples[1], samples[2], tally)
    for line in bad:
        print("NOT BOUNDED: " + line)
    print("bounded: yes" if not bad else "bounded: NO")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--quick", action="store_true", help="60 s")
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second")
    parser.add_argument("--store", default=None, help="a store URL (default: SQLite in a tmp dir)")
    parser.add_argument("--seed", type=int, default=20261201)
    args = parser.parse_args()
    duration = 60.0 if args.quick else args.duration
    return asyncio.run(soak(duration, args.rate, args.store, args.seed))


if __name__ == "__main__":
    sys.exit(main())
