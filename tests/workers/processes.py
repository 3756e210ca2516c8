"""A real ``gpugate serve --workers N`` as a subprocess, for the tests that speak HTTP only.

``GPUGATE_TEST_WORKERS=N`` (N > 1) makes :func:`harness.serving` start the gateway this way
instead of in the test's process, so every data-plane test written against ``serving`` runs
against a multi-worker gateway unchanged; ``.ci/run`` runs the data-plane files once more so.
A test that reaches into the gateway's internals (``RunningGateway.gateway``) cannot: in this
mode that attribute skips the test with a reason that says so (the in-process run has it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpugate.config import GatewayConfig

WORKERS_ENV = "GPUGATE_TEST_WORKERS"
READY = "all {workers} workers are serving"
START_BOUND_S = 30.0
STOP_BOUND_S = 30.0


def requested_workers() -> int:
    """The ``GPUGATE_TEST_WORKERS`` the run asks for (1: in process, as always)."""
    value = os.environ.get(WORKERS_ENV, "1")
    try:
        return max(1, int(value))
    except ValueError:
        pytest.fail(f"{WORKERS_ENV}={value!r} is not a number of workers")


class NotInProcess:
    """``RunningGateway.gateway`` of a gateway in another process: any use skips the test
    (it reads the internals of an in-process gateway; the in-process run covers it)."""

    def __getattr__(self, name: str) -> Any:
        pytest.skip(
            f"this test reads the gateway's internals (.gateway.{name}): it runs in process "
            f"only, not with {WORKERS_ENV}"
        )


def write_config(config: GatewayConfig, directory: Path) -> Path:
    """``config`` as the YAML file ``serve`` reads (the validated model, dumped back)."""
    path = directory / "gateway.yaml"
    document = config.model_dump(mode="json", exclude_defaults=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


@contextlib.asynccontextmanager
async def serve_process(
    config: GatewayConfig,
    *,
    workers: int | None,
    environ: Mapping[str, str] | None = None,
    port: int = 0,
    extra_args: tuple[str, ...] = (),
) -> AsyncIterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """``gpugate serve --workers N`` (``None``: no ``--workers``, the default) on
    127.0.0.1:<port> until the block ends (SIGTERM, then a bounded wait): its URL, its process
    and its log file."""
    directory = Path(tempfile.mkdtemp(prefix="gpugate-serve-test-"))
    path = write_config(config, directory)
    log_path = directory / "serve.log"
    env = {**os.environ, **(environ or {})}
    env.pop(WORKERS_ENV, None)
    command = [sys.executable, "-m", "gpugate", "serve", "--config", str(path)]
    command += ["--listen", f"127.0.0.1:{port}", *extra_args]
    if workers is not None:
        command += ["--workers", str(workers)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        url = await _wait_serving(proc, log_path, workers or 1)
        yield url, proc, log_path
    finally:
        await stop(proc)
        shutil.rmtree(directory, ignore_errors=True)


async def stop(proc: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM, then wait (bounded) for the drain; SIGKILL if it did not end: the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_BOUND_S
    while proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=5)
        return None
    return proc.returncode


async def _wait_serving(proc: subprocess.Popen[bytes], log_path: Path, workers: int) -> str:
    deadline = time.monotonic() + START_BOUND_S
    ready = READY.format(workers=workers) if workers > 1 else "Application startup complete"
    while time.monotonic() < deadline:
        text = log_path.read_text(encoding="utf-8", errors="replace")
        found = re.search(r"listening on (http\S*://\S+?:\d+)", text)
        if found and ready in text:
            return found.group(1)
        if proc.poll() is not None:
            pytest.fail(f"gpugate serve exited {proc.returncode} before serving:\n{text[-3000:]}")
        await asyncio.sleep(0.02)
    pytest.fail(f"gpugate serve --workers {workers} did not serve within {START_BOUND_S} s")


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` now (Linux: /proc)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii")
    except OSError:
        return []
    return [int(child) for child in text.split()]


def established_on(pid: int, port: int) -> int:
    """TCP connections process ``pid`` holds that were accepted on local ``port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text(encoding="ascii").splitlines()[1:]:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and fields[3] == "01":  # ESTABLISHED
                    inodes.add(fields[9])
    held = 0
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                link = str(fd.readlink())
                held += link.startswith("socket:[") and link[8:-1] in inodes
    return held
