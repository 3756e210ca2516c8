"""``gpugate demo --scenario``: each incident runs to its end on the demo's own fleet, config and
push worker, and leaves the fleet healthy again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpugate.config import load_config
from gpugate.demo import (
    DEMO_TOKEN,
    WORKER_SECRET_ENV,
    DemoWorker,
    banner,
    demo_config,
    fleet_spec,
    run_demo,
)
from gpugate.demo_scenarios import SCENARIOS, Stage, play
from gpugate.errors import GpugateError
from gpugate.fleet import Fleet
from harness import serving
from ports import free_port

# What the newcomer must see happen, per scenario (a line of its narration each).
WITNESS = {
    "xid": [
        "a chat request for it now answers 200 (by qwen-7b): its fallback qwen-7b stands in",
        "back in rotation; a chat request answers 200 (by qwen-35b)",
    ],
    "failover": [
        "turn 1, answered by qwen-35b",
        "turn 2, streamed: one unbroken stream ending in [DONE], answered by qwen-7b",
        "turn 3 is answered by qwen-7b at once, without a try on the dead server",
        "qwen-35b is back: turn 4 of the conversation is answered by qwen-35b",
    ],
    "saturate": ["a batch request answers 429 GPU_SATURATED", "is deferred", "completed"],
    "budget": [
        "past the soft cap (runtime.soft_cap, audited once)",
        "home-1 is over budget (its console page",
        "skipped it and ran on local",
        "within its raised budget: job",
    ],
    "auth": [
        "the gateway disabled home-1 (gateway:auth_error)",
        "the audit log has it: runtime.disabled runtime:home-1",
        "walked on and completed on local",
        "home-1 is back: job",
    ],
}


@pytest.fixture
async def stage(tmp_path: Path) -> AsyncIterator[tuple[Stage, list[str]]]:
    """The demo's fleet, push worker and config behind a real gateway; a stage that holds
    nothing on screen."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with (
        Fleet(fleet_spec()) as fleet,
        DemoWorker(fleet, url, "demo-worker-secret", tmp_path) as worker,
    ):
        path = tmp_path / "demo.yaml"
        text = demo_config(
            fleet, store=tmp_path / "demo.db", listen=f"127.0.0.1:{port}", worker_url=worker.url
        )
        path.write_text(text)
        env = {"GPUGATE_ADMIN_TOKEN": DEMO_TOKEN, WORKER_SECRET_ENV: "demo-worker-secret"}
        config = load_config(path, environ=env, require_env=True)
        async with serving(config, environ=env, port=port) as gw:
            said: list[str] = []
            yield (
                Stage(
                    gateway_url=gw.url,
                    token=DEMO_TOKEN,
                    exporter_url=fleet.exporter.url,
                    servers={name: s.url for name, s in fleet.servers.items()},
                    say=said.append,
                    restart_worker=worker.restart,
                    pace_s=0,
                    timeout_s=45,
                    poll_s=0.2,
                ),
                said,
            )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_each_scenario_runs_to_the_end_and_leaves_the_fleet_healthy(
    name: str, stage: tuple[Stage, list[str]]
) -> None:
    on, said = stage
    assert await on.healthy()
    await play(name, on)
    assert await on.healthy()
    story = "\n".join(said)
    for witness in WITNESS[name]:
        assert witness in story
    assert said[-1].endswith("the fleet is healthy again (watch it in the console)")


def test_every_scenario_has_its_witness_lines() -> None:
    assert sorted(SCENARIOS) == sorted(WITNESS)


async def test_an_unknown_scenario_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(GpugateError, match="known: xid, saturate, budget, failover, auth"):
        await run_demo("127.0.0.1", 0, workdir=tmp_path, scenario="meteor")


async def test_the_banner_prints_the_console_url_and_the_admin_token(tmp_path: Path) -> None:
    async with Fleet(fleet_spec()) as fleet:
        lines = banner(fleet, url="http://127.0.0.1:8080", workdir=tmp_path, token="t0k")
    assert "  console      http://127.0.0.1:8080/console    (log in with the admin token)" in lines
    assert "  admin token  t0k" in lines
