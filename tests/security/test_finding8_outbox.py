"""Finding 8 (issue #15): the worker's outbox stayed 0755 when its directory existed already,
and its reports were written 0644. Results may hold anything a job produced: only the worker's
user may read them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpugate.worker.calls import FinalReport
from gpugate.worker.outbox import Outbox


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def report(call_id: str) -> FinalReport:
    return FinalReport(call_id, "job-1", "token", "result", {"result": {"text": "private"}})


def test_finding8_an_outbox_directory_that_existed_world_readable_becomes_0700(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "outbox"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    left = directory / "call-left.json"
    left.write_bytes(report("call-left").to_json())
    left.chmod(0o644)

    Outbox(directory).open()

    assert (0o700, 0o600) == (mode(directory), mode(left))


def test_finding8_a_kept_report_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox")
    previous = os.umask(0o022)
    try:
        outbox.open()
        outbox.keep(report("call-1"))
    finally:
        os.umask(previous)

    assert 0o600 == mode(tmp_path / "outbox" / "call-1.json")
    assert [report("call-1")] == outbox.pending()
