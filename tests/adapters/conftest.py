"""The data plane's client under test, on both event loops the gateway may run on (asyncio's and
uvloop's); the raw upstream the tests talk to is :mod:`raw_upstream`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
import uvloop

from gpugate.adapters.upstream_client import UpstreamClient


def pytest_asyncio_loop_factories(
    config: pytest.Config,
    item: pytest.Item,
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Every test here runs on asyncio's loop and on uvloop's (the gateway's)."""
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    made = UpstreamClient()
    await made.start()
    try:
        yield made
    finally:
        await made.close()
