"""Done-when 1 of issue 6, end to end: a real ``gpugate serve`` and two real ``gpugate worker``
processes (two push runtimes, chain ``[home-1, home-2]``, ``max_concurrency`` 4 each) in front
of the simulated fleet's model server. 200 jobs complete; ``kill -9`` of one worker mid-job is
found by the reaper's backstop (its port refuses: the call is gone) and its jobs walk on to the
other worker. None is lost, none completed twice.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from e2e.jobs_e2e import GatewayProcess, create_jobs, write_config
from gpugate.fleet import ModelServer
from harness import eventually
from ports import free_port

pytestmark = pytest.mark.e2e

SECRETS = {"HOME1_SECRET": "home-1-secret", "HOME2_SECRET": "home-2-secret"}
EVENTS_SQL = (
    "SELECT j.slug, e.status, e.runtime, e.error_code FROM job_events e "
    "JOIN jobs j ON j.id = e.job_id ORDER BY e.id"
)


class WorkerProcess(GatewayProcess):
    """One ``gpugate worker`` subprocess for runtime ``home-<n>``; ``kill()`` is ``kill -9``."""

    def __init__(self, n: int, port: int, gateway: str, upstream: str, tmp: Path) -> None:
        super().__init__(tmp / f"worker{n}-state", port, tmp / f"worker{n}.log")
        self.args = [
            "worker", "--listen", f"127.0.0.1:{port}", "--gateway", gateway,
            "--runtime", f"home-{n}", "--secret-env", f"HOME{n}_SECRET", "--upstream", upstream,
            "--concurrency", "4", "--state-dir", str(self.config),
        ]  # fmt: skip

        self.ready_path = "/healthz"


def push_runtimes(ports: tuple[int, int]) -> str:
    entries = "".join(
        f"""\
  - id: home-{n}
    kind: push
    models: [qwen]
    push: {{url: "http://127.0.0.1:{port}/calls", secret_env: HOME{n}_SECRET}}
    max_concurrency: 4
"""
        for n, port in enumerate(ports, start=1)
    )
    return f"""\
runtimes:
{entries}fallback_chain: [home-1, home-2]
default_runtime: home-1
jobs: {{quiet_s: 2, reap_s: 0.5, sweep_s: 1}}
"""


def read(db: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        return list(conn.execute(sql))


def count(db: Path, where: str) -> int:
    """How many jobs match ``where``."""
    [(found,)] = read(db, f"SELECT count(*) FROM jobs WHERE {where}")
    assert isinstance(found, int)
    return found


async def test_200_jobs_on_two_push_workers_survive_kill_9_of_one_mid_job(
    tmp_path: Path, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    db = tmp_path / "gpugate.db"
    slugs = [f"p{i:03d}" for i in range(200)]
    gw_port, ports = free_port(), (free_port(), free_port())
    async with ModelServer(["qwen"], name="q0") as fake:
        # each job runs long enough that the kill lands mid-job even on a loaded machine
        fake.update(delay_s=0.2)
        config = write_config(
            tmp_path / "gw.yaml", port=gw_port, store=f"sqlite:///{db}",
            upstream_url=fake.url, extra=push_runtimes(ports),
        )  # fmt: skip
        gateway = GatewayProcess(config, gw_port, tmp_path / "gw.log")
        workers = [
            WorkerProcess(n, port, gateway.url, fake.url, tmp_path)
            for n, port in enumerate(ports, start=1)
        ]
        try:
            await gateway.start(http)
            for worker in workers:
                await worker.start(http)
            creating = asyncio.create_task(create_jobs(http, [gateway.url], slugs))

            def home1_mid_job() -> bool:
                return count(db, "state = 'completed'") >= 40 and (
                    count(db, "state = 'running' AND leased_by LIKE 'home-1:%'") > 0
                )

            await eventually(home1_mid_job, within_s=30, what="home-1 running jobs after 40 done")
            await workers[0].kill()
            await creating
            finished = "state IN ('completed', 'failed', 'cancelled')"
            await eventually(lambda: count(db, finished) == 200, within_s=90, what="all finished")
        finally:
            for worker in workers:
                await worker.stop()
            await gateway.stop()
        states = Counter(state for (state,) in read(db, "SELECT state FROM jobs"))
        events = read(db, EVENTS_SQL)
        executions = dict(fake.stats.executions)

    assert {"completed": 200} == dict(states)  # none lost
    completions = Counter(slug for slug, status, _, _ in events if status == "completed")
    assert set(slugs) == set(completions)
    assert {1} == set(completions.values())  # none completed twice
    by_runtime = Counter(runtime for _, status, runtime, _ in events if status == "completed")
    assert by_runtime["home-1"] > 0  # chain order: home-1 first ...
    assert by_runtime["home-2"] > 0  # ... and home-2 beyond its max_concurrency
    rescued = {slug for slug, status, _, _ in events if status == "rescued"}
    assert rescued, "the kill found home-1 mid-job: its calls were taken back"
    completed_on = {slug: rt for slug, status, rt, _ in events if status == "completed"}
    assert {"home-2"} == {completed_on[slug] for slug in rescued}  # they walked on
    busy = [slug for slug, _, _, code in events if code == "RUNTIME_BUSY"]
    assert [] == busy  # the gateway kept each worker within its max_concurrency
    ran_twice = {slug for slug, count in executions.items() if count > 1}
    assert set(slugs) == set(executions)
    assert ran_twice <= rescued  # only a call the kill interrupted ran again
