from __future__ import annotations

import asyncio
import random

import pytest

from gpugate.clock import ManualClock
from gpugate.core.admission import AdmissionPool, Slot
from gpugate.core.classes import RequestClass
from gpugate.errors import QueueFull, QueueTimeout

SYSTEM, INTERACTIVE, BATCH = RequestClass.SYSTEM, RequestClass.INTERACTIVE, RequestClass.BATCH
TIMEOUT_S = 30.0


def make_pool(
    max_inflight: int = 2, max_queue: int = 100, clock: ManualClock | None = None
) -> AdmissionPool:
    return AdmissionPool(
        max_inflight=max_inflight, max_queue=max_queue, clock=clock or ManualClock()
    )


async def settle() -> None:
    """Let every task that can run do so (no clock time passes)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def fill(pool: AdmissionPool) -> list[Slot]:
    """Hold every free slot."""
    return [await pool.acquire(SYSTEM, TIMEOUT_S) for _ in range(pool.max_inflight)]


def waiter(
    pool: AdmissionPool, cls: RequestClass, timeout_s: float = TIMEOUT_S
) -> asyncio.Task[Slot]:
    return asyncio.create_task(pool.acquire(cls, timeout_s))


async def test_a_free_slot_is_granted_at_once() -> None:
    pool = make_pool()

    slot = await pool.acquire(BATCH, TIMEOUT_S)

    assert pool.inflight == 1
    assert repr(slot) == "<Slot held>"


async def test_waiters_are_admitted_by_class_and_first_come_first_served_within_one() -> None:
    """Ten queued requests: system first, then every interactive, then batch; FIFO in each."""
    pool = make_pool(max_inflight=2)
    held = await fill(pool)
    admitted: list[str] = []

    async def request(label: str, cls: RequestClass) -> None:
        async with await pool.acquire(cls, TIMEOUT_S):
            admitted.append(label)

    arrivals = ["b1", "i1", "b2", "s1", "i2", "b3", "i3", "b4", "s2", "i4"]
    classes = {"s": SYSTEM, "i": INTERACTIVE, "b": BATCH}
    tasks = [asyncio.create_task(request(label, classes[label[0]])) for label in arrivals]
    await settle()
    assert repr(pool) == "<AdmissionPool inflight=2/2 queued=system:2 interactive:4 batch:4>"

    for slot in held:
        slot.release()
    await settle()
    assert all(task.done() for task in tasks)

    expected = ["s1", "s2", "i1", "i2", "i3", "i4", "b1", "b2", "b3", "b4"]
    assert expected == admitted
    assert repr(pool) == "<AdmissionPool inflight=0/2 queued=system:0 interactive:0 batch:0>"


async def test_system_is_admitted_before_an_interactive_request_that_came_first() -> None:
    pool = make_pool(max_inflight=1)
    (held,) = await fill(pool)
    interactive = waiter(pool, INTERACTIVE)
    await settle()
    system = waiter(pool, SYSTEM)
    await settle()

    held.release()
    await settle()

    assert system.done()
    assert not interactive.done()
    interactive.cancel()
    await settle()


async def test_a_full_queue_refuses_at_once_with_a_retry_after() -> None:
    pool = make_pool(max_inflight=1, max_queue=2)
    await fill(pool)
    queued = [waiter(pool, BATCH), waiter(pool, INTERACTIVE)]
    await settle()

    with pytest.raises(QueueFull) as caught:
        await pool.acquire(SYSTEM, TIMEOUT_S)

    assert caught.value.retry_after_s == 15.0
    assert pool.queued_by_class() == {SYSTEM: 0, INTERACTIVE: 1, BATCH: 1}
    for task in queued:
        task.cancel()
    await settle()


async def test_a_waiter_times_out_after_timeout_s_of_clock_time() -> None:
    clock = ManualClock()
    pool = make_pool(max_inflight=1, clock=clock)
    await fill(pool)
    task = waiter(pool, INTERACTIVE, timeout_s=30.0)
    await settle()

    clock.advance(29.9)
    await settle()
    assert not task.done()
    clock.advance(0.1)
    await settle()

    assert task.done()
    with pytest.raises(QueueTimeout) as caught:
        task.result()
    assert caught.value.retry_after_s == 15.0
    assert pool.queued == 0
    assert pool.inflight == 1


async def test_a_short_timeout_still_asks_to_retry_after_at_least_a_second() -> None:
    clock = ManualClock()
    pool = make_pool(max_inflight=1, clock=clock)
    await fill(pool)
    task = waiter(pool, BATCH, timeout_s=0.5)
    await settle()

    clock.advance(0.5)
    await settle()

    assert task.done()
    with pytest.raises(QueueTimeout) as caught:
        task.result()
    assert caught.value.retry_after_s == 1.0


async def test_a_slot_granted_at_the_moment_of_the_timeout_is_kept() -> None:
    clock = ManualClock()
    pool = make_pool(max_inflight=1, clock=clock)
    (held,) = await fill(pool)
    task = waiter(pool, BATCH, timeout_s=1.0)
    await settle()

    clock.advance(1.0)  # the timer fires ...
    held.release()  # ... and the slot is handed over before the waiter runs
    await settle()

    assert task.done()
    slot = task.result()
    assert pool.inflight == 1
    slot.release()
    assert pool.inflight == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_takes_no_slot() -> None:
    pool = make_pool(max_inflight=1)
    (held,) = await fill(pool)
    task = waiter(pool, INTERACTIVE)
    await settle()

    task.cancel()
    await settle()

    assert task.cancelled()
    assert pool.queued == 0
    held.release()
    assert pool.inflight == 0  # nothing was handed to the cancelled waiter
    slot = await pool.acquire(BATCH, TIMEOUT_S)
    assert pool.inflight == 1
    slot.release()


async def test_a_slot_handed_to_a_waiter_cancelled_at_the_same_moment_is_passed_on() -> None:
    pool = make_pool(max_inflight=1)
    (held,) = await fill(pool)
    first, second = waiter(pool, SYSTEM), waiter(pool, BATCH)
    await settle()

    held.release()  # hands the slot to `first` ...
    first.cancel()  # ... which is cancelled before it could run
    await settle()

    assert first.cancelled()
    assert second.done()
    slot = second.result()
    assert pool.inflight == 1
    slot.release()
    assert pool.inflight == 0


async def test_releasing_a_slot_twice_is_harmless() -> None:
    pool = make_pool(max_inflight=2)
    first, second = await fill(pool)

    first.release()
    first.release()

    assert pool.inflight == 1
    assert repr(first) == "<Slot released>"
    second.release()
    assert pool.inflight == 0


async def test_a_slot_is_released_when_its_context_exits_with_an_error() -> None:
    pool = make_pool()

    with pytest.raises(RuntimeError):
        async with await pool.acquire(BATCH, TIMEOUT_S):
            raise RuntimeError

    assert pool.inflight == 0


async def test_resizing_upward_admits_waiters_at_once() -> None:
    pool = make_pool(max_inflight=1)
    await fill(pool)
    tasks = [waiter(pool, BATCH) for _ in range(3)]
    await settle()

    pool.resize(3)
    await settle()

    assert [task.done() for task in tasks] == [True, True, False]
    assert repr(pool) == "<AdmissionPool inflight=3/3 queued=system:0 interactive:0 batch:1>"
    tasks[2].cancel()
    await settle()


async def test_resizing_downward_admits_no_one_until_below_the_new_limit() -> None:
    pool = make_pool(max_inflight=3)
    held = await fill(pool)
    task = waiter(pool, INTERACTIVE)
    await settle()

    pool.resize(1)
    held[0].release()
    held[1].release()
    await settle()
    assert not task.done()
    held[2].release()
    await settle()

    assert task.done()
    assert pool.inflight == 1


async def test_no_mix_of_grants_releases_cancellations_and_timeouts_leaks_a_slot() -> None:
    """A seeded random walk; at the end every slot is back and no one waits."""
    for seed in range(30):
        rng, clock = random.Random(seed), ManualClock()
        pool = make_pool(max_inflight=3, max_queue=5, clock=clock)
        held: list[Slot] = []
        tasks: list[asyncio.Task[Slot]] = []
        for _ in range(200):
            await _random_step(rng, clock, pool, held, tasks)
            assert 0 <= pool.inflight <= pool.max_inflight, (seed, repr(pool))
        for task in tasks:
            task.cancel()
        await settle()
        held.extend(
            t.result() for t in tasks if t.done() and not t.cancelled() and not t.exception()
        )
        for slot in held:
            slot.release()

        assert repr(pool) == "<AdmissionPool inflight=0/3 queued=system:0 interactive:0 batch:0>", (
            seed
        )


async def _random_step(
    rng: random.Random,
    clock: ManualClock,
    pool: AdmissionPool,
    held: list[Slot],
    tasks: list[asyncio.Task[Slot]],
) -> None:
    action = rng.choice(["acquire", "acquire", "release", "cancel", "advance"])
    if action == "acquire":
        tasks.append(waiter(pool, rng.choice(list(RequestClass)), timeout_s=rng.uniform(0.1, 3.0)))
    elif action == "release" and held:
        held.pop(rng.randrange(len(held))).release()
    elif action == "cancel" and tasks:
        tasks[rng.randrange(len(tasks))].cancel()
    elif action == "advance":
        clock.advance(rng.uniform(0.0, 1.0))
    if rng.random() < 0.7:
        await settle()
    for task in [t for t in tasks if t.done()]:
        tasks.remove(task)
        if not task.cancelled() and task.exception() is None:
            held.append(task.result())
