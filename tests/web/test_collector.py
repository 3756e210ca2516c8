"""web/collector: the cyclic collector's collections run between requests, not inside them.

The collector's own trigger is raised while gpugate serves, and a due collection waits until the
fast path has no request waiting for its answer to begin (issue #21, the burst tail; ``busy``
itself is pinned in test_fastpath.py). Real collections of this process's collector.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from gpugate.web import collector
from gpugate.web.collector import IdleCollector


@contextlib.contextmanager
def allocated(count: int) -> Iterator[list[list[int]]]:
    """``count`` tracked objects alive, the collector's own trigger off meanwhile (so only the
    :class:`IdleCollector` under test collects)."""
    enabled = gc.isenabled()
    gc.disable()
    kept: list[list[int]] = [[] for _ in range(count)]
    try:
        yield kept
    finally:
        kept.clear()
        if enabled:
            gc.enable()


async def test_a_due_collection_waits_while_busy_and_runs_once_quiet() -> None:
    busy = [True]
    idle = IdleCollector(lambda: busy[0])
    gc.collect()
    with allocated(collector.YOUNG * 2):
        assert idle.collect_if_due() is None
        assert gc.get_count()[0] > collector.YOUNG  # nothing was collected meanwhile
        busy[0] = False
        assert idle.collect_if_due() == 0
        assert gc.get_count()[0] < collector.YOUNG
        assert idle.collect_if_due() is None  # not due: fewer than YOUNG allocated since


async def test_the_older_generations_are_collected_in_turn_as_cpython_does() -> None:
    idle = IdleCollector(lambda: False)
    gc.collect()
    every = collector.OLDER_EVERY
    for _ in range((every + 1) * every + 1):  # the first full collection comes last
        with allocated(collector.YOUNG + 200):  # beyond the lists a free list reuses uncounted
            assert idle.collect_if_due() is not None
    assert [every * every, every, 1] == idle.collections


async def test_serving_raises_the_trigger_and_the_last_collector_stopped_restores_it() -> None:
    before = gc.get_threshold()
    first, second = IdleCollector(lambda: False), IdleCollector(lambda: False)
    first.start()
    second.start()
    assert gc.get_threshold()[0] == collector.SAFETY_YOUNG
    first.stop()
    assert gc.get_threshold()[0] == collector.SAFETY_YOUNG  # the second still runs
    second.stop()
    assert gc.get_threshold() == before
