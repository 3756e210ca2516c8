"""Issue 14 defect 6 / Done-when 3, the CI-sized run: ``kill -9`` of one of two PostgreSQL
replicas at a random point while answers are produced loses no job and completes none twice;
the jobs that run again are those in flight at the kill and those whose answer reached the
killed replica within the at-least-once window before it — measured here, per job, and
documented in the README ("Jobs") from ``bench/kill_window.py`` (three runs of 500 jobs).

The test asserts the window below ``CI_BOUND_MS``, a multiple of the documented figure: the
window is commit latency plus the replica's own scheduling, which a loaded CI machine stretches;
what it catches is a regression to "a whole batch of answers lost for seconds".
"""

from __future__ import annotations

import random
from pathlib import Path

import aiohttp
import pytest
from kill_window import kill_run

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(240)]

DOCUMENTED_WINDOW_MS = 150.0  # README "Jobs": the figure bench/kill_window.py measures
CI_BOUND_MS = 4 * DOCUMENTED_WINDOW_MS


async def test_kill_9_of_one_of_two_replicas_loses_nothing_and_reruns_only_the_window(
    tmp_path: Path, http: aiohttp.ClientSession, postgres_schema: str
) -> None:
    seed = random.randrange(1 << 30)
    run = await kill_run(tmp_path, http, postgres_schema, jobs=200, rng=random.Random(seed))
    print(f"\nseed {seed}: {run.summary()}")
    assert (0, 0) == (run.lost, run.completed_twice)
    assert run.max_window_ms <= CI_BOUND_MS
