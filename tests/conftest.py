"""Fixtures shared by every test tier."""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
from pathlib import Path

import aiohttp
import pytest

NO_POSTGRES = "PostgreSQL not reachable at"
NO_POSTGRES_NOTICE = (
    "PostgreSQL not reachable at 127.0.0.1:5432: the PostgreSQL half of the store and job "
    "suites is skipped (set GPUGATE_TEST_POSTGRES to require it)"
)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Fold every "no PostgreSQL" skip, whichever suite it comes from, into one summary line."""
    report = yield
    longrepr = report.longrepr
    if report.skipped and isinstance(longrepr, tuple) and NO_POSTGRES in longrepr[2]:
        # pytest folds skips with no line number per file; its annotation omits that case
        report.longrepr = (__file__, None, NO_POSTGRES_NOTICE)  # type: ignore[assignment]
    return report


@pytest.fixture
def sqlite_dsn(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'gpugate.db'}"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
