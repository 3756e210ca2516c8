"""The console in a real browser (Playwright driving Debian's Chromium) against a running
``gpugate demo``: log in, see the runtimes, drain one, import an invalid config, clear a GPU fault.

Without Chromium (``/usr/bin/chromium``) or the ``playwright`` package this module is skipped with
one notice; with ``GPUGATE_TEST_BROWSER=required`` (CI) it fails instead. Screenshots of each
step are kept in ``test-artifacts/browser/``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

CHROMIUM = os.environ.get("GPUGATE_TEST_CHROMIUM", "/usr/bin/chromium")  # Debian's build
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"
TOKEN = "demo-admin-token"
REQUIRED = os.environ.get("GPUGATE_TEST_BROWSER") == "required"

try:
    from playwright.sync_api import Browser, Dialog, Page, expect, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None  # type: ignore[assignment]

_missing = (
    "the playwright package is not installed"
    if sync_playwright is None
    else f"{CHROMIUM} is missing (apt-get install chromium)"
    if not Path(CHROMIUM).exists()
    else None
)
if _missing is not None:
    if REQUIRED:
        pytest.fail(f"browser tests required (GPUGATE_TEST_BROWSER): {_missing}", pytrace=False)
    pytest.skip(f"browser tests skipped: {_missing}", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _post_json(url: str, body: object) -> None:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert 200 == resp.status


class Demo:
    """A ``gpugate demo`` subprocess: its URL and its fake exporter's control URL."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        config = yaml.safe_load((workdir / "demo.yaml").read_text())
        self.exporter = config["gpu_health"]["dcgm_url"].removesuffix("/metrics")

    def set_gpu(self, index: int, **readings: object) -> None:
        _post_json(f"{self.exporter}/_control/gpus/{index}", readings)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    workdir = tmp_path_factory.mktemp("demo")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (workdir / "demo.log").open("wb")
    command = [sys.executable, "-m", "gpugate", "demo", "--listen", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(
        [*command, "--workdir", str(workdir)],
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


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, demo: Demo) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    yield tab
    context.close()


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def log_in(page: Page, demo: Demo, path: str = "/console") -> None:
    page.goto(demo.url + path)
    expect(page).to_have_url(f"{demo.url}/console/login?next={path}")
    page.fill("input[name=token]", TOKEN)
    page.fill("input[name=name]", "browser")
    page.click("button[type=submit]")
    expect(page).to_have_url(demo.url + path)


def answer_dialogs(page: Page, text: str = "") -> list[str]:
    """Accept every confirm/prompt (with ``text``); returns the questions asked."""
    asked: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        asked.append(dialog.message)
        dialog.accept(text)

    page.on("dialog", on_dialog)
    return asked


def test_an_operator_logs_in_and_sees_the_fleet_and_the_runtimes(page: Page, demo: Demo) -> None:
    log_in(page, demo)
    expect(page.locator("#upstreams tr[data-upstream]")).to_have_count(4)
    expect(page.locator("#gpus tr[data-gpu]")).to_have_count(2)
    expect(page.locator("header .who")).to_have_text("console:browser")
    shot(page, "01-fleet")
    page.click("nav >> text=Runtimes")
    expect(page.locator('#runtimes tr[data-runtime="local"] .state')).to_contain_text("enabled")
    shot(page, "02-runtimes")


def test_draining_a_runtime_shows_its_new_state_and_reason(page: Page, demo: Demo) -> None:
    log_in(page, demo, "/console/runtimes")
    asked = answer_dialogs(page, "browser test maintenance")
    row = page.locator('#runtimes tr[data-runtime="local"]')
    row.get_by_role("button", name="Drain").click()
    expect(page.locator(".flash.notice")).to_have_text("Runtime local is drained.")
    expect(row.locator(".state")).to_contain_text("drained")
    expect(row.locator(".state")).to_contain_text("browser test maintenance")
    assert asked[0].startswith("Drain runtime local?")
    shot(page, "03-drained")
    row.get_by_role("button", name="Enable").click()
    expect(row.locator(".state")).to_contain_text("enabled")


def test_an_invalid_config_import_shows_every_error_and_changes_nothing(
    page: Page, demo: Demo, tmp_path: Path
) -> None:
    log_in(page, demo, "/console/config")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "upstreams:\n  - id: qwen-35b\n    models: []\n    url: nowhere\n"
        "fallback_chain: [ghost]\nsurprise: 1\n"
    )
    page.set_input_files("#import-file", str(bad))
    expect(page.locator("#import-text")).to_have_value(bad.read_text())
    page.click("#import-form button[type=submit]")
    problems = page.locator("#problems li")
    expect(problems).to_have_count(4)
    for path in ("upstreams[0].models", "upstreams[0].url", "fallback_chain", "surprise"):
        expect(page.locator("#problems")).to_contain_text(path)
    expect(page.locator("#preview h3")).to_contain_text("nothing would change")
    shot(page, "04-invalid-import")
    page.goto(demo.url + "/console/config")
    expect(page.locator("#versions tbody tr")).to_have_count(1)


def test_a_faulted_gpu_appears_live_and_clearing_it_returns_its_upstream(
    page: Page, demo: Demo
) -> None:
    log_in(page, demo)
    gpu = page.locator('#gpus tr[data-gpu="fleet-node/0"]')
    qwen = page.locator('#upstreams tr[data-upstream="qwen-35b"]')
    expect(gpu).not_to_have_class("faulted")
    demo.set_gpu(0, xid=79)
    try:
        expect(gpu).to_have_class("faulted", timeout=20_000)  # the page refreshes itself
        expect(qwen).to_contain_text("GPU 0 faulted: XID 79")
        shot(page, "05-gpu-faulted")
        asked = answer_dialogs(page)
        gpu.get_by_role("button", name="Clear fault").click()
        expect(page.locator(".flash.notice")).to_contain_text("GPU fleet-node/0 cleared")
        expect(gpu).to_have_class("ok")
        expect(qwen.locator("td").nth(3)).to_have_text("in")
        assert asked[0].startswith("Clear the held fault of GPU fleet-node/0?")
        shot(page, "06-gpu-cleared")
    finally:
        demo.set_gpu(0, xid=0)
