"""Throughput and PostgreSQL cost at 1, 2 and 3 replicas on one store, and where one PostgreSQL
saturates (issue #20).

    python bench/replicas.py                  # ~3 min: 10 s of load per replica count
    python bench/replicas.py --duration 20 --replicas 1,2,3,4

Each replica count gets a fresh database (so ``pg_stat_database`` counts only gpugate), ``N``
``gpugate serve`` replicas with the default job timing behind nginx (the rig of
``tests/e2e/replicas_e2e.py``), and the simulated fleet. Measured per count:

* idle: transactions/s and connections with no traffic (heartbeats, config and state polls);
* under load (closed loop: chat completions, and job creators
  each waiting for its 202): chat req/s, jobs completed/s (in the store), transactions/s, the
  transactions per job, connections (peak), lock waits (share of ``pg_stat_activity`` samples
  waiting on a lock, every 50 ms) and rows deadlocked.

The baseline, in the same run: ``pgbench`` (TPC-B-like, 8 clients) on the same server, which
says how many write transactions/s this PostgreSQL sustains. The projection divides it by the
measured per-replica cost: at idle, and at the per-replica job rate measured here; and
``max_connections`` by the connections per replica. Prints a table and a Markdown summary for
BENCHMARKS.md. Needs nginx and pgbench (Debian: nginx-light, postgresql-client).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
from typing import Self

from replicas_e2e import JOB_MODEL, MESSAGES, MODEL, Nginx, Replica

from gpugate.fleet import ModelServer, ServerBehaviour

SERVER = os.environ.get("GPUGATE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
DEFAULT_TIMING = "{}"  # the defaults: sweep 60 s, reap 15 s, quiet 60 s
CHAT_CLIENTS = 8
JOB_CLIENTS = 16
PGBENCH_CLIENTS = 8
PER_REPLICA_POOL = 11  # the store's pool (max 10) and the LISTEN connection


def with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{name}"))


@dataclass
class Sample:
    xacts: int
    deadlocks: int


@dataclass
class Measured:
    replicas: int
    idle_tps: float
    idle_connections: int
    chat_rps: float
    jobs_per_s: float
    load_tps: float
    xacts_per_job: float
    peak_connections: int
    lock_wait_share: float
    deadlocks: int


async def counters(dsn: str, database: str) -> Sample:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        row = await (
            await conn.execute(
                "SELECT xact_commit + xact_rollback, deadlocks FROM pg_stat_database"
                " WHERE datname = %s",
                [database],
            )
        ).fetchone()
    assert row is not None
    return Sample(int(row[0]), int(row[1]))


class ActivitySampler:
    """Every 50 ms: the backends connected to the database, and how many wait on a lock."""

    def __init__(self, dsn: str, database: str) -> None:
        self._dsn = dsn
        self._database = database
        self.samples: list[tuple[int, int]] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        query = (
            "SELECT count(*), count(*) FILTER (WHERE wait_event_type = 'Lock')"
            " FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        )
        async with await psycopg.AsyncConnection.connect(self._dsn, autocommit=True) as conn:
            while True:
                row = await (await conn.execute(query, [self._database])).fetchone()
                assert row is not None
                self.samples.append((int(row[0]), int(row[1])))
                await asyncio.sleep(0.05)

    @property
    def peak(self) -> int:
        return max((n for n, _ in self.samples), default=0)

    @property
    def lock_share(self) -> float:
        backends = sum(n for n, _ in self.samples)
        return sum(w for _, w in self.samples) / backends if backends else 0.0


async def chat_loop(
    http: aiohttp.ClientSession, url: str, stop: asyncio.Event, done: list[int]
) -> None:
    """Chat completions one after the other (aiohttp: the load generator shares its process
    with the simulated fleet, and the ``openai`` client costs 3x the CPU per request)."""
    body = {"model": MODEL, "messages": MESSAGES}
    while not stop.is_set():
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            await resp.read()
        done[0] += 1


async def job_loop(
    http: aiohttp.ClientSession, url: str, stop: asyncio.Event, created: list[int], worker: int
) -> None:
    """Create jobs one after the other (each waits for its 202); completions are counted in
    the store."""
    n = 0
    while not stop.is_set():
        n += 1
        body = {"model": JOB_MODEL, "input": {"messages": MESSAGES}, "slug": f"b{worker}-{n}"}
        async with http.post(url + "/v1/jobs", json=body) as resp:
            assert resp.status == 202, await resp.text()
        created[0] += 1


_COMPLETED = "SELECT count(*) FROM jobs WHERE state = 'completed'"


async def completed(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        row = await (await conn.execute(_COMPLETED)).fetchone()
    assert row is not None
    return int(row[0])


async def measure(
    count: int, workdir: Path, dsn: str, database: str, duration_s: float
) -> Measured:
    async with (
        aiohttp.ClientSession() as http,
        ModelServer([MODEL], name="q0") as fleet,
        ModelServer([JOB_MODEL], name="q1", behaviour=ServerBehaviour(delay_s=0.01)) as jobs,
    ):
        replicas = [
            Replica(workdir, f"gw{i}", dsn, fleet.url, jobs.url, timing=DEFAULT_TIMING)
            for i in range(count)
        ]
        nginx = Nginx(workdir, [r.port for r in replicas])
        try:
            for replica in replicas:
                await replica.start(http)
            await nginx.start(http)
            await asyncio.sleep(3)  # past start-up: the first polls and the migrations' commits
            before = await counters(SERVER, database)
            async with ActivitySampler(SERVER, database) as idle:
                await asyncio.sleep(duration_s / 2)
            after = await counters(SERVER, database)
            idle_tps = (after.xacts - before.xacts) / (duration_s / 2)

            stop = asyncio.Event()
            chats, created = [0], [0]
            done_before = await completed(dsn)
            before = await counters(SERVER, database)
            started = time.monotonic()
            async with ActivitySampler(SERVER, database) as busy:
                tasks = [
                    asyncio.create_task(chat_loop(http, nginx.url, stop, chats))
                    for _ in range(CHAT_CLIENTS)
                ]
                tasks += [
                    asyncio.create_task(job_loop(http, nginx.url, stop, created, w))
                    for w in range(JOB_CLIENTS)
                ]
                await asyncio.sleep(duration_s)
                stop.set()
                elapsed = time.monotonic() - started
                after = await counters(SERVER, database)
                finished = await completed(dsn) - done_before
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            nginx.stop()
            for replica in replicas:
                if replica.alive:
                    await replica.stop()
    load_tps = (after.xacts - before.xacts) / elapsed
    jobs_per_s = finished / elapsed
    return Measured(
        replicas=count,
        idle_tps=idle_tps,
        idle_connections=idle.peak,
        chat_rps=chats[0] / elapsed,
        jobs_per_s=jobs_per_s,
        load_tps=load_tps,
        xacts_per_job=(load_tps - idle_tps) / jobs_per_s if jobs_per_s else 0.0,
        peak_connections=busy.peak,
        lock_wait_share=busy.lock_share,
        deadlocks=after.deadlocks - before.deadlocks,
    )


def pgbench_tps(dsn: str, duration_s: float) -> float:
    """Write transactions/s this PostgreSQL sustains: pgbench TPC-B-like, 8 clients."""
    pgbench = shutil.which("pgbench")
    if pgbench is None:
        raise SystemExit("pgbench is needed (apt-get install postgresql-client)")
    subprocess.run([pgbench, "-i", "-q", "-s", "4", dsn], check=True, capture_output=True)
    out = subprocess.run(
        [pgbench, "-c", str(PGBENCH_CLIENTS), "-j", "2", "-T", str(int(duration_s)), dsn],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found = re.search(r"tps = ([0-9.]+)", out)
    assert found is not None, out
    return float(found[1])


async def max_connections(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        row = await (await conn.execute("SHOW max_connections")).fetchone()
    assert row is not None
    return int(row[0])


async def fresh_database(name: str) -> str:
    async with await psycopg.AsyncConnection.connect(SERVER, autocommit=True) as conn:
        await conn.execute(f"DROP DATABASE IF EXISTS {name}")
        await conn.execute(f"CREATE DATABASE {name}")
    return with_database(SERVER, name)


async def drop_database(name: str) -> None:
    async with await psycopg.AsyncConnection.connect(SERVER, autocommit=True) as conn:
        await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def report(rows: list[Measured], capacity: float, connections: int, duration_s: float) -> None:
    print(f"\n== {len(rows)} replica counts, {duration_s:g} s of load each ==")
    head = (
        f"{'replicas':>8} {'idle tps':>9} {'idle conns':>10} {'chat req/s':>10} {'jobs/s':>7}"
        f" {'load tps':>9} {'xact/job':>8} {'peak conns':>10} {'lock waits':>10} {'deadlocks':>9}"
    )
    print(head)
    for m in rows:
        print(
            f"{m.replicas:>8} {m.idle_tps:>9.1f} {m.idle_connections:>10} {m.chat_rps:>10,.0f}"
            f" {m.jobs_per_s:>7.1f} {m.load_tps:>9.1f} {m.xacts_per_job:>8.2f}"
            f" {m.peak_connections:>10} {m.lock_wait_share:>9.1%} {m.deadlocks:>9}"
        )
    idle_per_replica = sum(m.idle_tps / m.replicas for m in rows) / len(rows)
    xact_per_job = sum(m.xacts_per_job for m in rows) / len(rows)
    loaded = max(rows, key=lambda m: m.replicas)
    jobs_per_replica = loaded.jobs_per_s / loaded.replicas
    per_replica_loaded = idle_per_replica + jobs_per_replica * xact_per_job
    print(f"\n== Projection: one PostgreSQL (baseline: pgbench {capacity:,.0f} tps here) ==")
    print(
        f"idle cost per replica: {idle_per_replica:.1f} tps -> "
        f"{capacity / idle_per_replica:,.0f} idle replicas"
    )
    print(
        f"store cost per job: {xact_per_job:.2f} transactions -> {capacity / xact_per_job:,.0f} "
        f"jobs/s at saturation, whatever the replica count"
    )
    print(
        f"a replica at this run's rate ({jobs_per_replica:.1f} jobs/s): "
        f"{per_replica_loaded:.1f} tps -> {capacity / per_replica_loaded:,.0f} such replicas"
    )
    print(
        f"connections: {PER_REPLICA_POOL} per replica at most, max_connections {connections}"
        f" -> {connections // PER_REPLICA_POOL} replicas before the server refuses"
    )


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load per count")
    parser.add_argument("--replicas", default="1,2,3", help="replica counts, e.g. 1,2,3")
    args = parser.parse_args()
    counts = [int(c) for c in args.replicas.split(",")]
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · {os.cpu_count()} cores · Python "
        f"{platform.python_version()} · {CHAT_CLIENTS} chat + {JOB_CLIENTS} job clients "
        "(closed loop)"
    )
    rows = []
    for count in counts:
        database = f"gpugate_bench_{count}"
        dsn = await fresh_database(database)
        try:
            with tempfile.TemporaryDirectory(prefix="gpugate-replicas-") as workdir:
                rows.append(await measure(count, Path(workdir), dsn, database, args.duration))
        finally:
            await drop_database(database)
        print(f"  {count} replica(s) measured", flush=True)
    baseline_db = "gpugate_bench_pgbench"
    dsn = await fresh_database(baseline_db)
    try:
        capacity = pgbench_tps(dsn, args.duration)
    finally:
        await drop_database(baseline_db)
    report(rows, capacity, await max_connections(SERVER), args.duration)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
