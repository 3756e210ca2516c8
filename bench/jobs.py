"""The job benchmark: durable async jobs through gpugate against the same lifecycle in bare SQL.

Per backend (SQLite, then PostgreSQL in a fresh schema dropped after), in one run so that the
ratios hold on a noisy machine:

1. bare SQL: N one-row inserts, claims of 10 per statement with a lease, a fenced completion per
   job, on one connection (psycopg 3 / sqlite3 WAL synchronous=NORMAL) — ``jobs_bare``;
2. end to end: N jobs created with ``POST /v1/jobs`` (32 in flight) on one ``gpugate serve``
   process, dispatched to the ``upstream`` runtime and completed against an instant upstream
   (nginx answering a canned chat completion); timed from the first POST to the last job's
   ``finished_at``, then every job checked completed with ``submit_count`` 1;
3. idle create-to-dispatch latency: jobs created one at a time, the ``queued`` and
   ``submitted`` events' times (the gateway's clock) compared.

    python bench/jobs.py [--jobs 5000] [--quick] [--backends sqlite,postgresql] [--profile DIR]

Exit status 1 when a job did not run exactly once or a phase could not finish. The modules:
``jobs_stores`` (where each backend's data lives), ``jobs_bare`` (the baseline), ``jobs_load``
(the gateway, the clients, the clocks), ``jobs_profile`` (py-spy), ``jobs_report`` (tables,
targets, the Markdown summary).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import uvloop
from jobs_load import (
    Timeline,
    create_jobs,
    idle_latency,
    overlapping,
    start_gateway,
    thread_cpu_s,
    wait_completed,
)
from jobs_profile import find_py_spy, recording, summarise
from jobs_report import EndToEnd, Result, Settings, backend_report, print_summary, print_targets
from jobs_stores import (
    BACKENDS,
    Connection,
    Target,
    completed,
    moments,
    problems,
    store_target,
)
from proxy_targets import (
    BenchError,
    Processes,
    _start_nginx,
    cpu_s,
    fake_upstream_http,
    free_port,
    wait_http,
)


class Run:
    """What one run needs everywhere: its settings, its folder, the fake upstream, py-spy."""

    def __init__(
        self, settings: Settings, workdir: Path, upstream_port: int, profile: Path | None
    ) -> None:
        self.settings = settings
        self.workdir = workdir
        self.upstream_port = upstream_port
        self.profile = profile
        self.py_spy = find_py_spy() if profile is not None else None

    def timeout_s(self, jobs: int) -> float:
        """A bound for N jobs: generous (50 jobs/s), never under a minute."""
        return max(60.0, jobs / 50)


# -- one backend --------------------------------------------------------------------------------


async def end_to_end(run: Run, base: str, pid: int, procs: Processes, conn: Connection) -> EndToEnd:
    """Warm up, then N jobs created, dispatched and completed; checked exactly once."""
    s = run.settings

    async def count() -> int:
        return await asyncio.to_thread(completed, conn)

    await create_jobs(base, s.warmup, s.concurrency, run.timeout_s(s.warmup))
    await wait_completed(count, s.warmup, run.timeout_s(s.warmup), procs.check)
    total = s.warmup + s.jobs
    cpu, client_cpu = [cpu_s(pid)], time.process_time()
    threads = thread_cpu_s(pid)
    out = None if run.profile is None else run.profile / f"gateway-{procs.workdir.name}.txt"
    with recording(run.py_spy, pid, out):
        created = await create_jobs(base, s.jobs, s.concurrency, run.timeout_s(s.jobs))
        cpu.append(cpu_s(pid))
        await wait_completed(count, total, run.timeout_s(s.jobs), procs.check)
    cpu.append(cpu_s(pid))
    client_cpu = time.process_time() - client_cpu
    store_thread_s = thread_cpu_s(pid)[0] - threads[0]
    when = await asyncio.to_thread(moments, conn, created.started)
    found = await asyncio.to_thread(problems, conn, total)
    found += [f"{len(v):,} jobs {k} in the run" for k, v in when.items() if len(v) != s.jobs]
    if out is not None:
        print(summarise(out), flush=True)
    gateway_cpu = (cpu[1] - cpu[0], cpu[2] - cpu[1])
    return EndToEnd(s.jobs, created.seconds, when, gateway_cpu, client_cpu, found, store_thread_s)


async def measure_gateway(
    run: Run, target: Target, procs: Processes
) -> tuple[EndToEnd, list[Timeline]]:
    """Start gpugate on the backend's store; the end-to-end and idle-latency phases."""
    base, pid = start_gateway(procs, "gpugate", target.dsn, run.upstream_port)
    conn = target.connect()
    try:
        print(f"  end to end: {run.settings.jobs:,} jobs ...", flush=True)
        e2e = await end_to_end(run, base, pid, procs, conn)
    finally:
        conn.close()
    s = run.settings
    print(f"  idle latency: {s.idle_jobs} jobs, {s.idle_pause_s * 1000:g} ms apart ...", flush=True)
    timeout = s.idle_jobs * (s.idle_pause_s + 1) + 30
    idle = await idle_latency(base, s.idle_jobs, s.idle_pause_s, timeout)
    procs.check()
    return e2e, idle


def run_backend(run: Run, backend: str) -> Result:
    workdir = run.workdir / backend
    workdir.mkdir()
    with store_target(backend, workdir) as target:
        print(f"\n-- {backend} ({target.version}) --", flush=True)
        print(f"  bare SQL: {run.settings.jobs:,} jobs ...", flush=True)
        bare = target.bare(run.settings.jobs)
        with Processes(workdir) as procs:
            e2e, idle = uvloop.run(measure_gateway(run, target, procs))
    result = Result(target.backend, target.version, bare, e2e, idle, overlapping(idle))
    print(backend_report(result), flush=True)
    return result


# -- the run ------------------------------------------------------------------------------------


def find_nginx() -> str:
    found = shutil.which("nginx", path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin")
    if found is None:
        raise BenchError("nginx is needed: apt-get install -y nginx-light")
    return found


def machine(nginx: str) -> dict[str, str]:
    nginx_v = subprocess.run([nginx, "-v"], capture_output=True, text=True, check=False)
    cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    model = next(
        (ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "?"
    )
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(len(os.sched_getaffinity(0))),
        "cpu": model,
        "python": platform.python_version(),
        "nginx": nginx_v.stderr.strip().removeprefix("nginx version: nginx/"),
        "kernel": platform.release(),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def start_upstream(procs: Processes, nginx: str) -> int:
    """The proxy bench's fake upstream: nginx answering a canned chat completion from memory."""
    json_port, sse_port = free_port(), free_port()
    spare = fake_upstream_http(json_port, sse_port, free_port(), free_port())  # second ports unused
    _start_nginx(procs, nginx, "upstream", spare)
    wait_http(procs, f"http://127.0.0.1:{json_port}/health")
    return json_port


def run(settings: Settings, backends: list[str], profile: Path | None) -> int:
    nginx = find_nginx()
    info = machine(nginx)
    print("== Machine ==\n" + "  ".join(f"{k}: {v}" for k, v in info.items()))
    print(
        f"{settings.jobs:,} jobs, {settings.concurrency} creates in flight, warm-up"
        f" {settings.warmup}; idle latency over {settings.idle_jobs} jobs"
    )
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="gpugate-jobs-") as tmp, Processes(Path(tmp)) as procs:
        job_run = Run(settings, Path(tmp), start_upstream(procs, nginx), profile)
        for backend in backends:
            results.append(run_backend(job_run, backend))
            procs.check()
    print_targets(results)
    print_summary(info, settings, results)
    return 1 if any(r.e2e.problems for r in results) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per backend (5000)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 500 jobs, 30 idle")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="sqlite,postgresql")
    parser.add_argument("--profile", type=Path, help="py-spy the gateway; raw stacks to DIR")
    args = parser.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    if args.jobs < 1:
        parser.error("--jobs: at least 1")
    if not backends or set(backends) - set(BACKENDS):
        parser.error(f"--backends: a comma-separated subset of {','.join(BACKENDS)}")
    if args.quick:
        settings = Settings(jobs=500, concurrency=32, warmup=50, idle_jobs=30, idle_pause_s=0.05)
    else:
        settings = Settings(args.jobs, concurrency=32, warmup=200, idle_jobs=200, idle_pause_s=0.05)
    if args.profile is not None and find_py_spy() is None:
        parser.error("--profile needs py-spy on PATH or at /tmp/pyspy/bin/py-spy")
    try:
        return run(settings, backends, args.profile)
    except (BenchError, psycopg.Error) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted; every process it started is stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
