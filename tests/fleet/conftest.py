"""Fixtures of the simulated fleet's tests: real servers on free 127.0.0.1 ports."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from gpugate.fleet import OPTIONAL_COUNTERS, FakeExporter, ModelServer

Until = Callable[[Callable[[], bool]], Awaitable[None]]


@pytest.fixture
async def server() -> AsyncIterator[ModelServer]:
    async with ModelServer(["alpha-7b"], name="alpha") as running:
        yield running


@pytest.fixture
async def exporter() -> AsyncIterator[FakeExporter]:
    counters = OPTIONAL_COUNTERS - {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"}
    async with FakeExporter(2, hostname="node-a", counters=counters) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def until() -> Until:
    """Wait for a condition with a bounded deadline (5 s), checking every 10 ms."""

    async def wait(condition: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"condition still false after {timeout} s")
            await asyncio.sleep(0.01)

    return wait
