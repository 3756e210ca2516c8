"""Three ``gpugate serve`` replicas on one PostgreSQL behind nginx, under a steady mix of chat,
streams and jobs (issue #20): a rolling restart costs nothing; a ``kill -9`` costs only what
the killed replica held, and its jobs are taken back and run once.

The rig is in ``replicas_e2e.py`` (nginx round robin with passive health, the ``openai``
client, jobs with an ``Idempotency-Key``); the simulated model server lives in the test process
and counts each job's executions by its ``X-Gpugate-Job`` header. Each test prints its figures.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest
from replicas_e2e import (
    JOB_MODEL,
    MODEL,
    NGINX,
    Load,
    Nginx,
    Replica,
    claims_released,
    job_outcomes,
    rescued_since,
    roll,
    wait_all_finished,
)

from gpugate.fleet import ModelServer, ServerBehaviour
from harness import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(240)]

# Requests in flight at any moment: a 20 ms answer, a stream of 8 chunks 50 ms apart; a job's
# call takes 1 s, so every replica holds some when it is stopped or killed.
BEHAVIOUR = ServerBehaviour(delay_s=0.02, chunk_delay_s=0.05, chunks=8)
JOB_BEHAVIOUR = ServerBehaviour(delay_s=1.0)
CLAIMS_BACK_S = 60  # DESIGN §5.3: a dead replica's leases are taken back within 60 s


@dataclass
class Rig:
    replicas: list[Replica]
    nginx: Nginx
    fleet: ModelServer  # chat and streams
    jobs_fleet: ModelServer  # the jobs' calls

    def executed_twice(self, slugs: list[str]) -> int:
        return sum(1 for slug in slugs if self.jobs_fleet.stats.executions.get(slug, 0) > 1)


@asynccontextmanager
async def three_replicas(
    tmp_path: Path, http: aiohttp.ClientSession, dsn: str
) -> AsyncIterator[Rig]:
    async with (
        ModelServer([MODEL], name="q0", behaviour=BEHAVIOUR) as fleet,
        ModelServer([JOB_MODEL], name="q1", behaviour=JOB_BEHAVIOUR) as jobs_fleet,
        _replicas(tmp_path, http, dsn, fleet, jobs_fleet) as (replicas, nginx),
    ):
        yield Rig(replicas, nginx, fleet, jobs_fleet)


@asynccontextmanager
async def _replicas(
    tmp_path: Path,
    http: aiohttp.ClientSession,
    dsn: str,
    fleet: ModelServer,
    jobs_fleet: ModelServer,
) -> AsyncIterator[tuple[list[Replica], Nginx]]:
    if not Path(NGINX).exists() and not os.environ.get("CI"):  # CI installs it (.ci/run)
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    replicas = [Replica(tmp_path, f"gw{i}", dsn, fleet.url, jobs_fleet.url) for i in range(3)]
    nginx = Nginx(tmp_path, [r.port for r in replicas])
    try:
        for replica in replicas:  # one after the other: the first applies the migrations
            await replica.start(http)
        await nginx.start(http)
        yield replicas, nginx
    finally:
        nginx.stop()
        for replica in replicas:
            if replica.alive:
                await replica.kill()


async def holds_job_calls(replica: Replica, http: aiohttp.ClientSession) -> None:
    """Wait (bounded) until ``replica`` has a job call in flight (upstream ``q1`` serves only
    the jobs), so that its death costs something to take back."""
    deadline = time.monotonic() + 20
    while await replica.inflight(http, "q1") < 1:
        if time.monotonic() > deadline:
            pytest.fail(f"{replica.name} held no job call within 20 s")
        await asyncio.sleep(0.05)


async def test_a_rolling_restart_of_three_replicas_under_load_fails_nothing_and_runs_each_job_once(
    tmp_path: Path, http: aiohttp.ClientSession, postgres_schema: str
) -> None:
    async with three_replicas(tmp_path, http, postgres_schema) as rig:
        async with Load(rig.nginx.url) as load:
            await eventually(lambda: load.tally.jobs_created >= 20, within_s=20, what="load")
            exits = []
            for replica in rig.replicas:  # one at a time, as a Deployment rolls
                exits.append(await roll(replica, rig.nginx, http))
                served = load.tally.requests
                await eventually(
                    lambda served=served: load.tally.requests >= served + 50,  # type: ignore[misc]
                    within_s=20,
                    what="load served after the restart",
                )
        finished_s = await wait_all_finished(postgres_schema, within_s=60)
        outcomes = await job_outcomes(postgres_schema, load.tally.slugs)
        twice = rig.executed_twice(load.tally.slugs)

    print(f"\nrolling restart of 3 replicas: {load.tally.summary()}")
    print(f"  {outcomes.summary()} · executed twice {twice} · all done {finished_s:.1f} s after")
    print(f"  replica exit codes {exits}; failures: {load.tally.failures[:5]}")
    assert [0, 0, 0] == exits
    assert [] == load.tally.failures  # no failed request, no broken stream, no failed submit
    assert (0, 0, 0) == (outcomes.lost, outcomes.duplicated, twice)
    assert load.tally.streams_ok > 0
    assert load.tally.jobs_created > 0


async def test_kill_9_of_one_of_three_fails_only_what_it_held_and_its_jobs_run_once(
    tmp_path: Path, http: aiohttp.ClientSession, postgres_schema: str
) -> None:
    async with three_replicas(tmp_path, http, postgres_schema) as rig:
        victim = rig.replicas[1]
        async with Load(rig.nginx.url) as load:
            await eventually(lambda: load.tally.jobs_created >= 30, within_s=20, what="load")
            await holds_job_calls(victim, http)
            pid = victim.pid
            killed = datetime.now(UTC)
            await victim.kill()
            killed_at = time.monotonic()
            served = load.tally.requests
            await eventually(
                lambda: load.tally.requests >= served + 150, within_s=20, what="survivors serve"
            )
        await claims_released(postgres_schema, pid, within_s=90)
        claims_back_s = time.monotonic() - killed_at  # an upper bound: polled once load ended
        await wait_all_finished(postgres_schema, within_s=90)
        finished_s = time.monotonic() - killed_at
        outcomes = await job_outcomes(postgres_schema, load.tally.slugs)
        rescued = await rescued_since(postgres_schema, killed)
        twice = rig.executed_twice(load.tally.slugs)
        held = rig.nginx.held_by()

    failures = load.tally.failures
    held_by_victim = [rid for _, rid, _ in failures if held.get(rid, ("", ""))[0] == victim.address]
    print(f"\nkill -9 of 1 of 3 replicas: {load.tally.summary()}")
    print(
        f"  failures {len(failures)}, held by the killed replica {len(held_by_victim)} "
        f"(chat {load.tally.failed('chat')}, streams {load.tally.failed('stream')}, "
        f"job submits {load.tally.failed('job')})"
    )
    print(
        f"  {outcomes.summary()} · job calls it held, taken back {rescued} · executed twice "
        f"{twice} · its claims back within {claims_back_s:.1f} s of the kill, every job done "
        f"{finished_s:.1f} s after it"
    )
    assert len(failures) == len(held_by_victim)  # nothing it did not hold failed
    assert (0, 0) == (outcomes.lost, outcomes.duplicated)  # every job completed exactly once
    assert rescued > 0  # it did hold job calls when it died
    assert claims_back_s < CLAIMS_BACK_S
    assert finished_s < CLAIMS_BACK_S
