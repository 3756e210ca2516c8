"""Done-when 4 of issue 14 (defect 3), end to end: a real ``gpugate serve`` and one real
``gpugate worker --concurrency 1`` behind a runtime configured ``max_concurrency: 4``. The worker
answers 429 to every call beyond its one slot; on main the jobs it refused failed
``CHAIN_EXHAUSTED`` within seconds. Busy is not a failed attempt: all 100 jobs complete, none
fails, the worker never runs more than one call at a time (counted at its model server, through
a counting loopback proxy), and the gateway learns the worker's real capacity from its 429s
instead of being refused for every job.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from kill_window import StampingProxy

from e2e.jobs_e2e import GatewayProcess, create_jobs, write_config
from gpugate.fleet import ModelServer
from harness import eventually
from ports import free_port
from push.test_push_e2e import EVENTS_SQL, count, read

pytestmark = pytest.mark.e2e

SECRET = {"HOME1_SECRET": "home-1-secret"}
JOBS = 100


class Worker(GatewayProcess):
    """``gpugate worker --concurrency 1`` for runtime ``home-1``."""

    def __init__(self, port: int, gateway: str, upstream: str, tmp: Path) -> None:
        super().__init__(tmp / "worker-state", port, tmp / "worker.log")
        self.args = [
            "worker", "--listen", f"127.0.0.1:{port}", "--gateway", gateway,
            "--runtime", "home-1", "--secret-env", "HOME1_SECRET", "--upstream", upstream,
            "--concurrency", "1", "--state-dir", str(self.config),
        ]  # fmt: skip
        self.ready_path = "/healthz"


def one_push_runtime(port: int) -> str:
    return f"""\
runtimes:
  - id: home-1
    kind: push
    models: [qwen]
    push: {{url: "http://127.0.0.1:{port}/calls", secret_env: HOME1_SECRET}}
    max_concurrency: 4
fallback_chain: [home-1]
default_runtime: home-1
jobs: {{quiet_s: 5, reap_s: 1, sweep_s: 1}}
"""


async def test_100_jobs_through_a_worker_of_concurrency_1_all_complete_none_fails_none_over(
    tmp_path: Path, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRET.items():
        monkeypatch.setenv(name, value)
    db = tmp_path / "gpugate.db"
    slugs = [f"b{i:03d}" for i in range(JOBS)]
    gw_port, worker_port = free_port(), free_port()
    async with ModelServer(["qwen"], name="q0") as fake:
        fake.update(delay_s=0.02)
        async with StampingProxy(fake.url).serving() as proxy:
            config = write_config(
                tmp_path / "gw.yaml", port=gw_port, store=f"sqlite:///{db}",
                upstream_url=fake.url, extra=one_push_runtime(worker_port),
            )  # fmt: skip
            gateway = GatewayProcess(config, gw_port, tmp_path / "gw.log")
            worker = Worker(worker_port, gateway.url, proxy.url, tmp_path)
            try:
                await gateway.start(http)
                await worker.start(http)
                await create_jobs(http, [gateway.url], slugs)
                finished = "state IN ('completed', 'failed', 'cancelled')"
                await eventually(
                    lambda: count(db, finished) == JOBS, within_s=180, what="all finished"
                )
            finally:
                await worker.stop()
                await gateway.stop()
        states = Counter(state for (state,) in read(db, "SELECT state FROM jobs"))
        events = read(db, EVENTS_SQL)
        executions = dict(fake.stats.executions)
    refusals = sum(1 for _, status, _, code in events if code == "RUNTIME_BUSY")
    print(f"\n{JOBS} jobs, worker concurrency 1, max_concurrency 4: {dict(states)}; "
          f"peak calls at the worker {proxy.peak}; 429s from the worker {refusals}")  # fmt: skip
    assert {"completed": JOBS} == dict(states)  # none failed, none lost
    assert [] == [slug for slug, status, _, _ in events if status == "failed"]
    assert 1 == proxy.peak  # the worker never ran more than the one call it accepts
    assert set(slugs) == set(executions)
    # The limit learned from the 429s: one probe above it every few jobs, not one 429 per job.
    assert refusals < JOBS // 4
