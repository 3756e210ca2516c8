"""The clocks' sleep honours a stop request that a library swallowed, so a loop always stops."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gpugate.clock import Clock, ManualClock, SystemClock


@pytest.mark.parametrize("clock", [SystemClock(), ManualClock()], ids=["system", "manual"])
async def test_a_loop_whose_cancellation_a_library_swallowed_stops_at_its_next_sleep(
    clock: Clock,
) -> None:
    ticks = 0

    async def swallowing_call() -> None:
        # what some drivers do with the cancellation of the call they were running
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)

    async def loop() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await swallowing_call()
            await clock.sleep(3600)

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert {task} == done
    assert task.cancelled()
    assert 1 == ticks
