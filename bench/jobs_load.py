"""The job benchmark's load: the gateway under test, the jobs sent to it, and the clocks read.

The gateway is ``gpugate serve`` (one process) in front of the proxy bench's fake upstream
(nginx answering a canned chat completion from memory: an instant runtime). Jobs are created
with ``POST /v1/jobs`` by a bounded number of aiohttp clients; completion is read in the store
(``jobs_stores``), a few times a second.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import aiohttp
from proxy_targets import BenchError, Processes, free_port, wait_http

MODEL = "json-model"
JOB = json.dumps(
    {"model": MODEL, "input": {"messages": [{"role": "user", "content": "Say hello"}]}}
).encode()
HEADERS = {"Content-Type": "application/json"}
POLL_S = 0.2  # how often the store is read while jobs run
STALL_S = 30.0  # no job completing for this long: the run is stuck


def gateway_yaml(port: int, dsn: str, upstream_port: int) -> str:
    """One upstream (the fake one), admission wide open; the implied ``local`` runtime."""
    url = f"http://127.0.0.1:{upstream_port}"
    limits = "max_inflight: 4096, max_queue: 100000"
    return (
        f"listen: 127.0.0.1:{port}\nstore: '{dsn}'\nupstreams:\n"
        f"  - {{id: {MODEL}, url: '{url}', models: [{MODEL}], {limits}}}\n"
    )


def start_gateway(procs: Processes, name: str, dsn: str, upstream_port: int) -> tuple[str, int]:
    """``gpugate serve`` on a free port; its base URL and pid once ``/readyz`` answers."""
    port = free_port()
    config = procs.workdir / f"{name}.yaml"
    config.write_text(gateway_yaml(port, dsn, upstream_port))
    serve = ["serve", "--config", str(config), "--log-level", "WARNING"]
    pid = procs.start(name, [sys.executable, "-m", "gpugate", *serve])
    base = f"http://127.0.0.1:{port}"
    wait_http(procs, f"{base}/readyz")
    return base, pid


def thread_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of the gateway's threads other than the event loop's (on SQLite: mostly the
    store's thread), and of the event loop's thread (the process's first)."""
    others = loop = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except FileNotFoundError:  # a thread that just ended
            continue
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
        if task.name == str(pid):
            loop += ticks
        else:
            others += ticks
    tick = os.sysconf("SC_CLK_TCK")
    return others / tick, loop / tick


def session(connections: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=connections)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=30), trust_env=False
    )


# -- creating jobs --------------------------------------------------------------------------------


@dataclass
class Created:
    """What N creates returned: the slugs, the wall clock at the start, how long they took."""

    slugs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    started: float = 0.0  # time.time() before the first POST
    seconds: float = 0.0  # until the last 202


async def _create(client: aiohttp.ClientSession, base: str, into: Created) -> float:
    """One ``POST /v1/jobs``; its round trip in seconds."""
    start = time.perf_counter()
    async with client.post(f"{base}/v1/jobs", data=JOB, headers=HEADERS) as resp:
        body = await resp.read()
    if resp.status != 202:
        into.errors.append(f"POST /v1/jobs answered {resp.status}: {body[:200]!r}")
    else:
        into.slugs.append(json.loads(body)["slug"])
    return time.perf_counter() - start


async def create_jobs(base: str, count: int, concurrency: int, timeout_s: float) -> Created:
    """``count`` jobs, ``concurrency`` POSTs in flight at a time."""
    created = Created(started=time.time())
    left = iter(range(count))
    start = time.perf_counter()

    async def worker(client: aiohttp.ClientSession) -> None:
        for _ in left:
            await _create(client, base, created)

    async with session(concurrency) as client, asyncio.timeout(timeout_s):
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    created.seconds = time.perf_counter() - start
    if created.errors:
        raise BenchError(f"{len(created.errors)} creates failed; first: {created.errors[0]}")
    return created


async def wait_completed(
    count: Callable[[], Awaitable[int]], total: int, timeout_s: float, check: Callable[[], None]
) -> None:
    """Until ``count()`` reaches ``total``; BenchError when it stalls or takes too long."""
    deadline = time.monotonic() + timeout_s
    last, moved = -1, time.monotonic()
    while (done := await count()) < total:
        check()
        now = time.monotonic()
        if done != last:
            last, moved = done, now
        if now - moved > STALL_S or now > deadline:
            raise BenchError(f"{done} of {total} jobs completed; gave up after {timeout_s:g} s")
        await asyncio.sleep(POLL_S)


# -- create-to-dispatch latency ------------------------------------------------------------------


@dataclass(frozen=True)
class Timeline:
    """One job's events by the gateway's clock, as ms after its ``queued`` event."""

    queued: datetime
    dispatching_ms: float
    submitted_ms: float
    completed_ms: float
    post_ms: float  # the client's round trip of the POST


async def _events(client: aiohttp.ClientSession, base: str, slug: str) -> dict[str, datetime]:
    """The first time of each event status of a job."""
    async with client.get(f"{base}/v1/jobs/{slug}/events") as resp:
        if resp.status != 200:
            raise BenchError(f"GET /v1/jobs/{slug}/events answered {resp.status}")
        events = (await resp.json())["data"]
    seen: dict[str, datetime] = {}
    for event in events:
        seen.setdefault(event["status"], datetime.fromisoformat(event["at"]))
    return seen


def _timeline(seen: dict[str, datetime], post_s: float) -> Timeline:
    missing = {"queued", "dispatching", "submitted", "completed"} - seen.keys()
    if missing:
        raise BenchError(f"a job has no {', '.join(sorted(missing))} event: {sorted(seen)}")
    queued = seen["queued"]

    def after(status: str) -> float:
        return (seen[status] - queued).total_seconds() * 1000

    return Timeline(
        queued, after("dispatching"), after("submitted"), after("completed"), post_s * 1000
    )


async def idle_latency(base: str, count: int, pause_s: float, timeout_s: float) -> list[Timeline]:
    """``count`` jobs one at a time, ``pause_s`` apart, then each one's events."""
    created = Created()
    posts: list[float] = []
    async with session(1) as client, asyncio.timeout(timeout_s):
        for _ in range(count):
            posts.append(await _create(client, base, created))
            await asyncio.sleep(pause_s)
        if created.errors:
            raise BenchError(f"{len(created.errors)} creates failed: {created.errors[0]}")
        await asyncio.sleep(max(pause_s, 0.5))  # the last one completes
        seen = [await _events(client, base, slug) for slug in created.slugs]
    return [_timeline(events, post) for events, post in zip(seen, posts, strict=True)]


def overlapping(timelines: list[Timeline]) -> int:
    """How many jobs were created before the previous one completed (the gateway not idle)."""
    return sum(
        prev.queued + timedelta(milliseconds=prev.completed_ms) > cur.queued
        for prev, cur in itertools.pairwise(timelines)
    )
