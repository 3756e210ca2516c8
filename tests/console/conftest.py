"""A gateway with a fake exporter behind it, and an operator's browser-like session to it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from console_rig import Console, console_of

from gpugate.fleet import FakeExporter


@pytest.fixture
async def console(sqlite_dsn: str) -> AsyncIterator[Console]:
    """Two upstreams on GPUs 0 and 1 of a fake exporter; the monitor polls only when told."""
    async with FakeExporter(gpus=2) as exporter, console_of(sqlite_dsn, exporter) as running:
        yield running
