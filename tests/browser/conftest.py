"""One Chromium per browser test module (each module skips itself without one); closed at the
module's end, so the sync Playwright loop is gone before asyncio tests run in the same process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from browser_rig import CHROMIUM

if TYPE_CHECKING:
    from playwright.sync_api import Browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()
