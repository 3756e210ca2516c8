"""The processes an end-to-end test started, so none outlives its test.

A test that times out (pytest-timeout) or fails before its own clean-up leaves ``gpugate serve``
and nginx processes behind, holding ports and PostgreSQL connections for the rest of the run.
Every helper that starts one calls :func:`track`; the e2e conftest kills whatever is still
running once each test is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from typing import TypeVar

_P = TypeVar("_P", asyncio.subprocess.Process, "subprocess.Popen[bytes]")
_started: list[asyncio.subprocess.Process | subprocess.Popen[bytes]] = []


def track(proc: _P) -> _P:
    """Remember ``proc`` until the end of the current test."""
    _started.append(proc)
    return proc


def kill_leftovers() -> list[int]:
    """SIGKILL every tracked process that has not exited (never one already reaped, whose pid
    may belong to someone else now); the pids killed."""
    killed = []
    while _started:
        proc = _started.pop()
        if isinstance(proc, subprocess.Popen):
            proc.poll()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
                killed.append(proc.pid)
            if isinstance(proc, subprocess.Popen):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
    return killed
