"""The browser tests' rig: Debian's Chromium through Playwright, and ``gpugate demo`` subprocesses.

Without Chromium (``/usr/bin/chromium``) or the ``playwright`` package a browser test module is
skipped with one notice (:func:`require_browser`); with ``GPUGATE_TEST_BROWSER=required`` (CI)
it fails instead. Screenshots are kept in ``test-artifacts/browser/``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from ports import free_port

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = os.environ.get("GPUGATE_TEST_CHROMIUM", "/usr/bin/chromium")  # Debian's build
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"
TOKEN = "demo-admin-token"
REQUIRED = os.environ.get("GPUGATE_TEST_BROWSER") == "required"


def require_browser() -> None:
    """Skip the calling test module (fail it under ``GPUGATE_TEST_BROWSER=required``) without
    Playwright or Chromium."""
    try:
        import playwright.sync_api  # noqa: F401 - only probing that it is installed
    except ImportError:  # pragma: no cover - the dev extra installs it
        missing: str | None = "the playwright package is not installed"
    else:
        missing = (
            None if Path(CHROMIUM).exists() else f"{CHROMIUM} is missing (apt-get install chromium)"
        )
    if missing is not None:
        if REQUIRED:
            pytest.fail(f"browser tests required (GPUGATE_TEST_BROWSER): {missing}", pytrace=False)
        pytest.skip(f"browser tests skipped: {missing}", allow_module_level=True)


def _post_json(url: str, body: object) -> None:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert 200 == resp.status


class Demo:
    """A ``gpugate demo`` subprocess: its URL, workdir and its fake exporter's control URL."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.workdir = workdir
        config = yaml.safe_load((workdir / "demo.yaml").read_text())
        self.exporter = config["gpu_health"]["dcgm_url"].removesuffix("/metrics")

    def set_gpu(self, index: int, **readings: object) -> None:
        _post_json(f"{self.exporter}/_control/gpus/{index}", readings)

    def log(self) -> str:
        return (self.workdir / "demo.log").read_text()


@contextmanager
def running_demo(workdir: Path, *args: str) -> Iterator[Demo]:
    """``gpugate demo --listen 127.0.0.1:PORT --workdir W *args`` until ready (30 s at most),
    terminated on the way out."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (workdir / "demo.log").open("wb")
    command = [sys.executable, "-m", "gpugate", "demo", "--listen", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(
        [*command, "--workdir", str(workdir), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "GPUGATE_ADMIN_TOKEN": TOKEN},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (workdir / "demo.log").read_text()
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the demo did not become ready in 30 s"
            time.sleep(0.1)
        yield Demo(url, workdir)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()


def shot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def log_in(page: Page, demo: Demo, path: str = "/console") -> None:
    from playwright.sync_api import expect

    page.goto(demo.url + path)
    expect(page).to_have_url(f"{demo.url}/console/login?next={path}")
    page.fill("input[name=token]", TOKEN)
    page.fill("input[name=name]", "browser")
    page.click("button[type=submit]")
    expect(page).to_have_url(demo.url + path)
