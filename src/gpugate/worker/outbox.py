"""Finished reports kept on local disk until the gateway has taken them.

One file per call (``<call_id>.json``), written to a temporary name, flushed to disk and
renamed, so a worker killed mid-write leaves the old state or the new one, never half a file.
A worker that restarts reads every report left and sends it again.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from gpugate.worker.calls import FinalReport

log = logging.getLogger("gpugate.worker.outbox")

_CALL_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


class Outbox:
    """The directory of reports the gateway has not acknowledged yet."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory

    @property
    def directory(self) -> Path:
        return self._dir

    def open(self) -> None:
        """Create the directory (and its parents) if needed; only this user may read it."""
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def keep(self, report: FinalReport) -> None:
        """Write ``report`` durably before anything is sent."""
        path = self._path(report.call_id)
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as out:
            out.write(report.to_json())
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(path)

    def forget(self, call_id: str) -> None:
        """The gateway took (or refused for good) the report of ``call_id``."""
        self._path(call_id).unlink(missing_ok=True)

    def pending(self) -> list[FinalReport]:
        """Every report kept, oldest first; unreadable files are logged and set aside."""
        reports = []
        files = sorted(self._dir.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for path in files:
            try:
                reports.append(FinalReport.from_json(path.read_bytes()))
            except (OSError, ValueError, KeyError):
                log.exception("outbox: %s is unreadable; moved aside", path)
                path.replace(path.with_suffix(".broken"))
        return reports

    def _path(self, call_id: str) -> Path:
        if not _CALL_ID.fullmatch(call_id):
            raise ValueError(f"invalid call id {call_id!r}")
        return self._dir / f"{call_id}.json"

    def __repr__(self) -> str:
        return f"<Outbox {self._dir}>"
