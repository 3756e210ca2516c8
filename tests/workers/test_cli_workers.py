"""``gpugate serve --workers``: what the option accepts, and its default."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

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


def test_auto_is_the_cores_this_process_may_run_on_and_the_default_is_unset() -> None:
    auto = build_parser().parse_args(["serve", "--config", "gw.yaml", "--workers", "auto"])
    default = build_parser().parse_args(["serve", "--config", "gw.yaml"])
    assert len(os.sched_getaffinity(0)) == default_workers() == auto.workers
    assert default.workers is None  # serve runs one process (test_supervisor pins it)


def test_a_killed_supervisors_private_directory_is_removed_by_the_next_one() -> None:
    from gpugate.workers import _remove_stale_dirs

    gone = Path(tempfile.mkdtemp(prefix="gpugate-workers-999999999-"))  # no such process
    (gone / "worker-0.sock").touch()
    alive = Path(tempfile.mkdtemp(prefix=f"gpugate-workers-{os.getpid()}-"))
    try:
        _remove_stale_dirs()
        assert not gone.exists()
        assert alive.exists()
    finally:
        shutil.rmtree(gone, ignore_errors=True)
        shutil.rmtree(alive, ignore_errors=True)
