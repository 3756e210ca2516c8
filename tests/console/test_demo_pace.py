"""``gpugate demo --scenario NAME --pace S``: the pace a person watches a scenario at."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpugate.config import load_config
from gpugate.demo import MAX_PACE_S, WORKER_SECRET_ENV, demo_config, fleet_spec, run_demo
from gpugate.errors import GpugateError
from gpugate.fleet import Fleet


@pytest.mark.parametrize("pace", [-1.0, MAX_PACE_S + 1])
async def test_a_pace_out_of_range_is_refused_before_anything_starts(
    pace: float, tmp_path: Path
) -> None:
    with pytest.raises(GpugateError, match="--pace must be between 0 and 600 seconds"):
        await run_demo("127.0.0.1", 0, workdir=tmp_path, scenario="xid", pace_s=pace)
    assert not (tmp_path / "demo.yaml").exists()


def test_the_demo_help_explains_the_pace() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpugate", "demo", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},  # one line per option: nothing wraps mid-phrase
    )
    assert "--pace S" in done.stdout
    assert "hold each state S seconds" in done.stdout


@pytest.mark.parametrize("access_log", [True, False])
async def test_a_scenario_turns_the_access_log_off_so_its_narration_stays_readable(
    access_log: bool, tmp_path: Path
) -> None:
    async with Fleet(fleet_spec()) as fleet:
        text = demo_config(
            fleet,
            store=tmp_path / "demo.db",
            listen="127.0.0.1:0",
            worker_url="http://127.0.0.1:9",
            access_log=access_log,
        )
    (tmp_path / "demo.yaml").write_text(text)
    environ = {"GPUGATE_ADMIN_TOKEN": "t", WORKER_SECRET_ENV: "s"}
    config = load_config(tmp_path / "demo.yaml", environ=environ, require_env=True)
    assert (access_log, 2.0) == (config.server.access_log, config.server.console_sample_s)
