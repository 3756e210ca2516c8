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
_DIR_MODE = 0o700  # results may hold anything a job produced: only the worker's user reads them
_FILE_MODE = 0o600


class Outbox:
    """The directory of reports the gateway has not acknowledged yet."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory

    @property
    def directory(self) -> Path:
        return self._dir

    def open(self) -> None:
        """Create the directory (and its parents) if needed; only this user may read it
        (``0700``, also when it existed already, and ``0600`` for the reports left in it)."""
        self._dir.mkdir(parents=True, exist_ok=True, mode=_DIR_MODE)
        self._dir.chmod(_DIR_MODE)  # mkdir's mode is masked by the umask and ignores a dir there
        for path in self._dir.iterdir():
            if path.is_file() and not path.is_symlink():
                path.chmod(_FILE_MODE)

    def keep(self, report: FinalReport) -> None:
        """Write ``report`` durably before anything is sent."""
        path = self._path(report.call_id)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, _FILE_MODE)
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), _FILE_MODE)  # a .tmp left by a crash keeps its old mode
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
