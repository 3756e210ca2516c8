"""Budgets hold across replicas (DESIGN §5 Guardrails, issue 7 done-when 1): two real
``gpugate serve`` processes on one PostgreSQL dispatch fifty jobs at once to a push runtime
whose budget has room for exactly ten reservations, and exactly ten are reserved and submitted.

The push worker is a fake in the test process that holds every call (so no reservation is
settled during the race); the forty jobs that find no room skip the runtime ``over_budget``
and, with nothing else in their chain, fail ``CHAIN_EXHAUSTED``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import psycopg
import pytest
from jobs_e2e import GatewayProcess, create_jobs, write_config

from gpugate.fleet import ModelServer
from guard.guard_rig import FakeWorker
from ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

# 2 x daily_cents = 10 cents; each call reserves cents_per_second x estimate_s = 1 cent.
RUNTIME = """\
runtimes:
  - id: home-1
    kind: push
    models: [qwen]
    push: {{url: {url}, secret_env: HOME1_SECRET}}
    max_concurrency: 100
    budget: {{daily_cents: 5, cents_per_second: 0.1, estimate_s: 10}}
fallback_chain: [home-1]
default_runtime: home-1
"""


async def test_fifty_dispatches_on_two_replicas_with_room_for_ten_reserve_exactly_ten(
    tmp_path: Path,
    http: aiohttp.ClientSession,
    postgres_schema: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOME1_SECRET", "secret-of-home-1")
    slugs = [f"b-{i:02d}" for i in range(50)]
    async with ModelServer(["qwen"], name="q0") as fake, FakeWorker().serving() as worker:
        gateways = []
        for name in ("gw1", "gw2"):
            port = free_port()
            config = write_config(
                tmp_path / f"{name}.yaml",
                port=port,
                store=postgres_schema,
                upstream_url=fake.url,
                extra=RUNTIME.format(url=worker.url),
            )
            gateways.append(GatewayProcess(config, port, tmp_path / f"{name}.log"))
        try:
            for gateway in gateways:
                await gateway.start(http)
            await create_jobs(http, [g.url for g in gateways], slugs, concurrency=50)
            rows = await until_settled(postgres_schema, len(slugs))
        finally:
            for gateway in gateways:
                await gateway.stop()
        async with await psycopg.AsyncConnection.connect(postgres_schema) as conn:
            entries = await (await conn.execute("SELECT state FROM ledger")).fetchall()
            spent = await (await conn.execute("SELECT cents FROM spend_days")).fetchall()
    states = [state for state, _ in rows]
    print(f"\n50 jobs on two replicas, room for 10: {len(worker.calls)} calls submitted")
    assert 10 == len(worker.calls)
    assert [("reserved",)] * 10 == entries
    assert [(10.0,)] == spent
    assert {"dispatching": 10, "failed": 40} == {s: states.count(s) for s in set(states)}
    assert all("over_budget" in (message or "") for state, message in rows if state == "failed")


async def until_settled(dsn: str, count: int) -> list[tuple[str, str | None]]:
    """Wait (20 s at most) until every job has ended its walk: failed, or its call recorded
    (``leased_by = home-1:<call_id>``); the jobs' states and error messages."""
    sql = "SELECT state, error_message, leased_by FROM jobs"
    async with asyncio.timeout(20):
        while True:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                rows = await (await conn.execute(sql)).fetchall()
            walked = [
                row for row in rows if row[0] == "failed" or (row[2] or "").startswith("home-1:c")
            ]
            if len(walked) == count:
                return [(state, message) for state, message, _ in rows]
            await asyncio.sleep(0.05)
