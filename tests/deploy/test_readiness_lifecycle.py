"""The replica's lifecycle on its way out: serving → draining → stopping → cut, and /readyz."""

from __future__ import annotations

import aiohttp

from gpugate.clock import ManualClock
from gpugate.services.readiness import Lifecycle
from harness import make_config, serving, upstream

UPSTREAM = [upstream("a", ["http://127.0.0.1:9"], ["m"])]


def test_phases_move_forward_and_each_listener_is_called_once_when_its_phase_begins() -> None:
    lifecycle = Lifecycle(ManualClock())
    seen: list[str] = []
    for phase in ("draining", "stopping", "cut"):
        lifecycle.on(phase, lambda phase=phase: seen.append(phase))  # type: ignore[misc]

    lifecycle.stop(grace_s=5)  # a stop without a drain still passes through draining
    lifecycle.drain()  # never backwards
    lifecycle.cut()
    lifecycle.cut()

    assert ["draining", "stopping", "cut"] == seen
    assert "cut" == lifecycle.phase


def test_a_listener_for_a_phase_already_begun_is_called_at_once() -> None:
    lifecycle = Lifecycle(ManualClock())
    lifecycle.drain()
    seen: list[str] = []

    lifecycle.on("draining", lambda: seen.append("draining"))

    assert ["draining"] == seen


def test_the_grace_counts_down_from_the_stop_on_the_clock() -> None:
    clock = ManualClock()
    lifecycle = Lifecycle(clock)
    before = lifecycle.remaining_s()
    lifecycle.stop(grace_s=10)
    clock.advance(4)
    during = lifecycle.remaining_s()
    clock.advance(10)

    assert (0.0, 6.0, 0.0) == (before, during, lifecycle.remaining_s())


async def test_readyz_is_503_naming_the_drain_while_the_replica_still_serves(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with serving(make_config(sqlite_dsn, UPSTREAM)) as gw:
        gw.gateway.lifecycle.drain()
        async with http.get(gw.url + "/readyz") as resp:
            body = await resp.json()
        async with http.get(gw.url + "/healthz") as alive:
            alive_status = alive.status

    failed = {c["name"]: c["detail"] for c in body["checks"] if not c["ok"]}
    assert 503 == resp.status
    assert ["lifecycle"] == list(failed)
    assert failed["lifecycle"].startswith("draining")
    assert 200 == alive_status  # liveness is not readiness: nothing should restart it
