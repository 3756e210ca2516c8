"""The console in a real browser (Playwright driving Debian's Chromium) against a running
``gpugate demo``: log in, see the runtimes, drain one, import an invalid config, clear a GPU fault.

Without Chromium or Playwright it is skipped (failed under ``GPUGATE_TEST_BROWSER=required``,
see :mod:`browser_rig`). Screenshots of each step are kept in ``test-artifacts/browser/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_rig import Demo, log_in, require_browser, running_demo, shot

require_browser()

from playwright.sync_api import Browser, Dialog, Page, expect  # noqa: E402


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    with running_demo(tmp_path_factory.mktemp("demo")) as running:
        yield running


@pytest.fixture
def page(browser: Browser, demo: Demo) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    yield tab
    context.close()


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
    expect(page.locator("#upstreams tr[data-upstream]")).to_have_count(5)  # qwen-7b: the fallback
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
