"""``gpugate demo --scenario``: each playable incident runs to its end on the demo's own fleet and
config, and leaves the fleet healthy again; a pending one is refused, saying why."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpugate.config import load_config
from gpugate.demo import (
    DEMO_TOKEN,
    WORKER_SECRET_ENV,
    banner,
    demo_config,
    fleet_spec,
    run_demo,
)
from gpugate.demo_scenarios import SCENARIOS, Stage, play
from gpugate.errors import GpugateError
from gpugate.fleet import Fleet
from harness import serving

PLAYABLE = [name for name, s in SCENARIOS.items() if s.pending is None]
PENDING = [name for name, s in SCENARIOS.items() if s.pending is not None]
# What the newcomer must see happen, per scenario (a line of its narration each).
WITNESS = {
    "xid": ["answers 503 NO_HEALTHY_UPSTREAM", "back in rotation; a chat request answers 200"],
    "saturate": ["a batch request answers 429 GPU_SATURATED", "is deferred", "completed"],
}


@pytest.fixture
async def stage(tmp_path: Path) -> AsyncIterator[tuple[Stage, list[str]]]:
    """The demo's fleet and config behind a real gateway; a stage that holds nothing on screen."""
    async with Fleet(fleet_spec()) as fleet:
        path = tmp_path / "demo.yaml"
        # home-1's worker is not started: these scenarios play on the upstream runtime
        text = demo_config(
            fleet,
            store=tmp_path / "demo.db",
            listen="127.0.0.1:0",
            worker_url="http://127.0.0.1:9",
        )
        path.write_text(text)
        env = {"GPUGATE_ADMIN_TOKEN": DEMO_TOKEN, WORKER_SECRET_ENV: "unused"}
        config = load_config(path, environ=env, require_env=True)
        async with serving(config, environ=env) as gw:
            said: list[str] = []
            yield (
                Stage(
                    gateway_url=gw.url,
                    token=DEMO_TOKEN,
                    exporter_url=fleet.exporter.url,
                    servers={name: s.url for name, s in fleet.servers.items()},
                    say=said.append,
                    pace_s=0,
                    timeout_s=45,
                    poll_s=0.2,
                ),
                said,
            )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", PLAYABLE)
async def test_each_playable_scenario_runs_to_the_end_and_leaves_the_fleet_healthy(
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


def test_every_playable_scenario_has_its_witness_lines() -> None:
    assert sorted(PLAYABLE) == sorted(WITNESS)


@pytest.mark.parametrize("name", PENDING)
async def test_a_pending_scenario_is_refused_saying_what_it_waits_for(
    name: str, tmp_path: Path
) -> None:
    with pytest.raises(GpugateError, match="cannot play yet: needs"):
        await run_demo("127.0.0.1", 0, workdir=tmp_path, scenario=name)


async def test_an_unknown_scenario_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(GpugateError, match="known: xid, saturate, budget, auth"):
        await run_demo("127.0.0.1", 0, workdir=tmp_path, scenario="meteor")


async def test_the_banner_prints_the_console_url_and_the_admin_token(tmp_path: Path) -> None:
    async with Fleet(fleet_spec()) as fleet:
        lines = banner(fleet, url="http://127.0.0.1:8080", workdir=tmp_path, token="t0k")
    assert "  console      http://127.0.0.1:8080/console    (log in with the admin token)" in lines
    assert "  admin token  t0k" in lines
