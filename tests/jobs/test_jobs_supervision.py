"""Supervised loops (issue #17, Done-when 3): a loop that raises is restarted with backoff and
counted, ``/readyz`` names it while it is down or restarting in a tight cycle, and the
dispatcher's loop survives any exception in one pass."""

from __future__ import annotations

import asyncio

import aiohttp
from jobs_rig import rig
from prometheus_client.parser import text_string_to_metric_families

from gpugate.clock import ManualClock
from gpugate.services.supervisor import Supervisor
from harness import eventually, make_config, serving, upstream


class Flaky:
    """A loop body that raises ``failures`` times, then runs until cancelled."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.starts = 0
        self.healthy = asyncio.Event()

    async def run(self) -> None:
        self.starts += 1
        if self.starts <= self.failures:
            raise RuntimeError(f"injected failure {self.starts}")
        self.healthy.set()
        await asyncio.Event().wait()


async def test_a_loop_that_raises_is_restarted_counted_and_reported_until_it_settles() -> None:
    clock = ManualClock()
    restarted: list[str] = []
    loops = Supervisor(clock, restarted.append, base_s=1.0, max_s=4.0, tight_window_s=60.0)
    flaky = Flaky(failures=3)
    loops.start("flaky", flaky.run)
    try:
        for n in range(1, 4):
            await eventually(lambda: bool(clock._sleepers), what=f"restart {n} is waiting")
            status = loops.status("flaky")
            assert status is not None
            assert ("restarting", f"RuntimeError: injected failure {n}") == (
                status.state,
                status.last_error,
            )
            assert [f"flaky is down (RuntimeError: injected failure {n}), restarting"] == (
                loops.problems()
            )
            clock.advance(4.0)  # past the backoff's ceiling
        await asyncio.wait_for(flaky.healthy.wait(), timeout=5)
        tight = loops.problems()
        clock.advance(61)
        settled = loops.problems()
    finally:
        await loops.stop()
    assert ["flaky"] * 3 == restarted
    assert ["flaky restarted 3 times in 60 s (RuntimeError: injected failure 3)"] == tight
    assert [] == settled
    assert 4 == flaky.starts


async def test_one_failing_loop_never_stops_its_siblings_and_stop_awaits_every_one() -> None:
    clock = ManualClock()
    loops = Supervisor(clock)
    steady, broken = Flaky(failures=0), Flaky(failures=1_000)
    loops.start("steady", steady.run)
    loops.start("broken", broken.run)
    await asyncio.wait_for(steady.healthy.wait(), timeout=5)
    await eventually(lambda: bool(clock._sleepers), what="broken waits for its restart")
    await loops.stop()
    states = [loops.status(name) for name in ("steady", "broken")]
    assert ["finished", "finished"] == [s.state for s in states if s is not None]
    assert [] == [t for t in asyncio.all_tasks() if t.get_name().startswith("gpugate.steady")]


async def test_an_injected_raising_loop_shows_on_readyz_and_in_the_restart_counter(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    config = make_config(sqlite_dsn, [upstream("q0", ["http://127.0.0.1:9"], ["qwen"])])
    flaky = Flaky(failures=1_000_000)
    async with serving(config) as gw:
        async with http.get(gw.url + "/readyz") as resp:
            before = resp.status
        gw.gateway.loops.start("injected", flaky.run)
        await eventually(lambda: flaky.starts >= 4, within_s=30, what="three restarts")
        async with http.get(gw.url + "/readyz") as resp:
            ready = (resp.status, await resp.json())
        async with http.get(gw.url + "/metrics") as resp:
            text = await resp.text()
    restarts = {
        sample.labels["loop"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "gateway_loop_restarts"
        for sample in family.samples
        if sample.name == "gateway_loop_restarts_total"
    }
    status, body = ready
    failed = {c["name"]: c["detail"] for c in body["checks"] if not c["ok"]}
    assert (200, 503) == (before, status)
    assert ["loops"] == list(failed)
    assert "injected" in failed["loops"]
    assert "RuntimeError: injected failure" in failed["loops"]
    assert restarts["injected"] >= 3


async def test_the_dispatcher_loop_survives_an_exception_in_one_pass(dsn: str) -> None:
    """On main only a ``StoreError`` was caught: anything else ended the dispatcher for good
    and the replica claimed nothing more (while ``/readyz`` said ready)."""
    async with rig(dsn) as r:
        store = r.store
        real_claim = store.claim_job
        broke: list[str] = []

        async def claim_once_broken(slug: str, **kwargs: object) -> object:
            if not broke:
                broke.append(slug)
                raise ValueError("a bug in one pass")
            return await real_claim(slug, **kwargs)  # type: ignore[arg-type]

        store.claim_job = claim_once_broken  # type: ignore[method-assign]
        baseline = len(r.clock._sleepers)
        task = asyncio.create_task(r.dispatcher.run())
        try:
            await eventually(lambda: len(r.clock._sleepers) > baseline, what="dispatcher waits")
            await r.submit("j1")
            r.dispatcher.wake("j1")
            await eventually(lambda: bool(broke), what="the broken pass")
            await eventually(lambda: len(r.clock._sleepers) > baseline, what="it waits again")
            alive = not task.done()
            r.clock.advance(60)  # the next sweep
            await r.until("j1", "completed", within_s=10)
        finally:
            r.dispatcher.stop()
            await asyncio.wait_for(task, timeout=10)
    assert ["j1"] == broke
    assert alive
