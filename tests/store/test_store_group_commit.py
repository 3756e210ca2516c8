"""Group commit: the first write goes at once, what arrives meanwhile goes together next."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from gpugate.errors import StoreError, StoreUnavailable
from gpugate.store.group_commit import GroupCommit


class Gate:
    """A flush that records its batches and waits to be let through, one batch at a time."""

    def __init__(self, *, fail: Exception | None = None, bad: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.open = asyncio.Event()
        self.open.set()
        self._fail = fail
        self._bad = bad

    async def flush(self, items: Sequence[str]) -> list[str | Exception]:
        self.batches.append(list(items))
        await self.open.wait()
        if self._fail is not None:
            raise self._fail
        if self._bad in items and len(items) > 1:
            raise StoreError("one bad row rolled the batch back")
        return [
            ValueError(f"no {item}") if item.startswith("x") else item.upper() for item in items
        ]


async def test_an_idle_write_is_flushed_at_once_alone() -> None:
    gate = Gate()
    group: GroupCommit[str, str] = GroupCommit(gate.flush)

    answer = await asyncio.wait_for(group.submit("a"), timeout=5)

    assert ("A", [["a"]]) == (answer, gate.batches)


async def test_writes_arriving_while_one_is_in_flight_go_together_in_the_next_flush() -> None:
    gate = Gate()
    gate.open.clear()
    group: GroupCommit[str, str] = GroupCommit(gate.flush)
    first = asyncio.ensure_future(group.submit("a"))
    while not gate.batches:  # the first flush has started and is held
        await asyncio.sleep(0)
    rest = [asyncio.ensure_future(group.submit(item)) for item in ("b", "c", "d")]
    await asyncio.sleep(0)
    gate.open.set()

    answers = await asyncio.gather(first, *rest)

    assert ["A", "B", "C", "D"] == answers
    assert [["a"], ["b", "c", "d"]] == gate.batches


async def test_each_write_gets_its_own_failure_and_the_others_succeed() -> None:
    gate = Gate()
    group: GroupCommit[str, str] = GroupCommit(gate.flush)

    answers = await asyncio.gather(
        *(group.submit(item) for item in ("a", "x1", "b")), return_exceptions=True
    )

    assert "A" == answers[0]
    assert isinstance(answers[1], ValueError)
    assert "B" == answers[2]


async def test_a_batch_rolled_back_by_one_write_is_written_again_one_by_one() -> None:
    gate = Gate(bad="bad")
    gate.open.clear()
    group: GroupCommit[str, str] = GroupCommit(gate.flush)
    first = asyncio.ensure_future(group.submit("a"))
    while not gate.batches:
        await asyncio.sleep(0)
    rest = [asyncio.ensure_future(group.submit(item)) for item in ("b", "bad", "c")]
    await asyncio.sleep(0)
    gate.open.set()

    answers = await asyncio.gather(first, *rest, return_exceptions=True)

    assert ["A", "B", "BAD", "C"] == answers  # alone, "bad" went through here
    assert [["a"], ["b", "bad", "c"], ["b"], ["bad"], ["c"]] == gate.batches


async def test_an_unreachable_store_fails_every_write_of_the_batch_without_retrying() -> None:
    gate = Gate(fail=StoreUnavailable("gone"))
    group: GroupCommit[str, str] = GroupCommit(gate.flush)

    answers = await asyncio.gather(
        *(group.submit(item) for item in ("a", "b")), return_exceptions=True
    )

    assert all(isinstance(answer, StoreUnavailable) for answer in answers)
    assert [["a", "b"]] == gate.batches


async def test_a_batch_holds_at_most_max_batch_writes() -> None:
    gate = Gate()
    group: GroupCommit[str, str] = GroupCommit(gate.flush, max_batch=2)

    await asyncio.gather(*(group.submit(item) for item in ("a", "b", "c", "d", "e")))

    assert [["a", "b"], ["c", "d"], ["e"]] == gate.batches


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        GroupCommit(Gate().flush, max_batch=0)


async def two_in_flight(
    group: GroupCommit[str, str], gate: Gate
) -> tuple[asyncio.Future[str], asyncio.Future[str]]:
    """``a`` submitted, then ``b`` while ``a``'s flush is held: both flushes held."""
    gate.open.clear()
    first = asyncio.ensure_future(group.submit("a"))
    while len(gate.batches) < 1:
        await asyncio.sleep(0)
    second = asyncio.ensure_future(group.submit("b"))
    while len(gate.batches) < 2:  # started while "a" is still held
        await asyncio.sleep(0)
    return first, second


async def test_with_overlap_a_write_arriving_while_a_flush_is_in_flight_goes_at_once() -> None:
    """PostgreSQL's fenced writes (overlap 2): a completion waits for no unrelated batch to
    commit; a third batch waits until one of the two in flight is done."""
    gate = Gate()
    group: GroupCommit[str, str] = GroupCommit(gate.flush, overlap=2)
    first, second = await two_in_flight(group, gate)
    rest = [asyncio.ensure_future(group.submit(item)) for item in ("c", "d")]
    for _ in range(5):
        await asyncio.sleep(0)
    held = [list(batch) for batch in gate.batches]
    gate.open.set()

    answers = await asyncio.gather(first, second, *rest)

    assert [["a"], ["b"]] == held
    assert ["A", "B", "C", "D"] == answers
    assert [["a"], ["b"], ["c", "d"]] == gate.batches
    assert "<GroupCommit flushes=3 items=4>" == repr(group)


async def test_with_overlap_a_cancelled_drain_leaves_the_queue_to_the_other() -> None:
    gate = Gate()
    group: GroupCommit[str, str] = GroupCommit(gate.flush, overlap=2)
    first, second = await two_in_flight(group, gate)
    later = asyncio.ensure_future(group.submit("c"))
    await asyncio.sleep(0)
    drains = [t for t in asyncio.all_tasks() if t.get_name() == "gpugate.store.group_commit"]
    drains[0].cancel()
    await asyncio.sleep(0)
    gate.open.set()

    answers = await asyncio.gather(first, second, later, return_exceptions=True)

    assert 1 == sum(isinstance(answer, StoreUnavailable) for answer in answers[:2])
    assert "C" == answers[2]


def test_overlap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="overlap"):
        GroupCommit(Gate().flush, overlap=0)
