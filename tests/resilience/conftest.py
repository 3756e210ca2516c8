"""Fixtures of the resilience suite: the rig with and without a fallback model."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from resilience.rig import Rig, running_rig


@pytest.fixture
async def rig(sqlite_dsn: str) -> AsyncIterator[Rig]:
    """The primary ``m`` with the fallback ``fb`` configured (and as its context fallback)."""
    async with running_rig(sqlite_dsn, with_fallback=True) as running:
        yield running


@pytest.fixture
async def alone(sqlite_dsn: str) -> AsyncIterator[Rig]:
    """The primary ``m`` with no fallback configured."""
    async with running_rig(sqlite_dsn, with_fallback=False) as running:
        yield running


@pytest.fixture(params=[False, True], ids=["json", "stream"])
def stream(request: pytest.FixtureRequest) -> bool:
    """Each fault non-streamed and streamed."""
    return bool(request.param)
