"""``gpugate serve --workers``: what the option accepts, and its default."""

from __future__ import annotations

import os

import pytest

from gpugate.cli import build_parser
from gpugate.workers import default_workers


@pytest.mark.parametrize("value", ["0", "-1", "257", "two"])
def test_workers_outside_1_to_256_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--config", "gw.yaml", "--workers", value])
    assert 2 == exited.value.code
    assert "--workers" in capsys.readouterr().err


def test_the_default_is_the_cores_this_process_may_run_on() -> None:
    args = build_parser().parse_args(["serve", "--config", "gw.yaml"])
    assert args.workers is None  # resolved at serve time
    assert len(os.sched_getaffinity(0)) == default_workers()
