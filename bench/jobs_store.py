"""The job store alone: the lifecycle ``bench/jobs.py`` drives, without HTTP, the dispatcher or a
runtime, so a change to the store shows in CPU per job without the end-to-end run's noise.

Per backend, in a fresh store (``jobs_stores``): batches of 32 jobs created concurrently (one
group commit), claimed in one claim, each submit recorded and each completion written
concurrently (two group commits) — the writes ``bench/jobs.py`` makes per job. Printed: the
process's CPU per job, of which the SQLite store's thread (on PostgreSQL everything is the event
loop's), and wall time per job. Run it alternated against another tree (``PYTHONPATH``) to
compare; ``--profile`` prints a cProfile of the store's thread (SQLite) by own time.

    python bench/jobs_store.py [--jobs 3000] [--backends sqlite,postgresql] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from jobs_stores import BACKENDS, store_target

from gpugate.clock import SystemClock
from gpugate.store import NewJob, Store
from gpugate.store.factory import open_store

BATCH = 32
INPUT = {"messages": [{"role": "user", "content": "Say hello"}]}
RESULT = {"choices": [{"message": {"role": "assistant", "content": "Hello!"}}]}


def _thread_cpu_s(tid: int | None) -> float:
    if tid is None:
        return 0.0
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _on_store_thread(store: Store, call: Any) -> Any:
    """``call`` run on the SQLite store's thread (its executor), None elsewhere."""
    executor = getattr(store, "_executor", None)
    if executor is None:
        return None
    return await asyncio.get_running_loop().run_in_executor(executor, call)


async def lifecycle(store: Store, batches: int) -> None:
    for _ in range(batches):
        news = (NewJob(model="m", input=INPUT, runner="up") for _ in range(BATCH))
        await asyncio.gather(*(store.create_job(new) for new in news))
        jobs = await store.claim_jobs(limit=BATCH, lease_s=60)
        leases = [(job.slug, job.lease_token or "") for job in jobs]
        await asyncio.gather(
            *(
                store.record_submit(slug, token, runtime="up", call_id=f"c-{slug}", lease_s=60,
                                    running=True)
                for slug, token in leases
            )
        )  # fmt: skip
        done = (store.complete(s, t, result=RESULT, actor="worker:up") for s, t in leases)
        if not all(await asyncio.gather(*done)):
            raise SystemExit("bench: a completion was refused")


async def measure(dsn: str, jobs: int, profile: bool) -> str:
    store = open_store(dsn, clock=SystemClock())
    await store.open()
    try:
        await store.migrate()
        await lifecycle(store, 2)  # warm-up: statements prepared, caches filled
        profiler = cProfile.Profile()
        tid = await _on_store_thread(store, threading.get_native_id)
        if profile:
            await _on_store_thread(store, profiler.enable)
        batches = max(1, jobs // BATCH)
        cpu, thread, wall = time.process_time(), _thread_cpu_s(tid), time.perf_counter()
        await lifecycle(store, batches)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        thread = _thread_cpu_s(tid) - thread
        if profile:
            await _on_store_thread(store, profiler.disable)
    finally:
        await store.close()
    n = batches * BATCH
    line = (
        f"{n:,} jobs: process CPU {cpu / n * 1e6:,.0f} µs/job (store thread"
        f" {thread / n * 1e6:,.0f}), wall {wall / n * 1e6:,.0f} µs/job"
    )
    if profile and tid is not None:
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(20)
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--profile", action="store_true", help="cProfile the SQLite thread")
    args = parser.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    if set(backends) - set(BACKENDS):
        parser.error(f"--backends: a comma-separated subset of {','.join(BACKENDS)}")
    with tempfile.TemporaryDirectory(prefix="gpugate-jobs-store-") as tmp:
        for backend in backends:
            workdir = Path(tmp) / backend
            workdir.mkdir()
            with store_target(backend, workdir) as target:
                print(f"{backend}: {asyncio.run(measure(target.dsn, args.jobs, args.profile))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
