"""Configured GPU ids → verdicts across exporters, MIG instances folded into their GPU, and
staleness judged by each exporter's successful scrapes."""

from __future__ import annotations

import pytest
from gpu_factories import TABLE, fixture_readings, reading, thresholds

from gpugate.core.gpu.dcgm import GpuKey
from gpugate.core.gpu.health import NEVER_SEEN, GpuFleetState, gpu_key_for

MIG = "dcgm-exporter-runai-a100-mig-4instances.prom"


def fleet() -> GpuFleetState:
    return GpuFleetState(TABLE, thresholds())


@pytest.mark.parametrize(
    ("gpu_id", "expected"),
    [
        (0, (None, 0)),
        (7, (None, 7)),
        ("node-a/0", ("node-a", 0)),
        ("10.0.0.5/12", ("10.0.0.5", 12)),
    ],
)
def test_a_configured_gpu_id_names_a_host_and_an_index(
    gpu_id: int | str, expected: tuple[str | None, int]
) -> None:
    assert expected == gpu_key_for(gpu_id)


@pytest.mark.parametrize("gpu_id", [-1, "node-a", "/0", "node-a/x", "node-a/"])
def test_a_malformed_gpu_id_is_refused(gpu_id: int | str) -> None:
    with pytest.raises(ValueError, match="GPU index"):
        gpu_key_for(gpu_id)


def test_with_one_exporter_an_index_names_the_gpu_whatever_its_hostname_label() -> None:
    gpus = fleet()
    gpus.observe_scrape([reading(0, host="ip-10-0-0-1", xid=79)], now=0.0)

    assert (True, False) == (gpus.verdicts_for(0, 0.0).faulted, gpus.verdicts_for(1, 0.0).faulted)


def test_with_many_exporters_the_configured_host_names_the_gpu() -> None:
    gpus = fleet()
    gpus.observe_scrape([reading(0, host="ip-10-0-0-1", xid=79)], now=0.0, host="node-a")
    gpus.observe_scrape([reading(0, host="ip-10-0-0-2", xid=0)], now=0.0, host="node-b")

    actual = [gpus.verdicts_for(gpu_id, 0.0).faulted for gpu_id in ("node-a/0", "node-b/0")]

    assert [True, False] == actual
    assert {GpuKey("node-a", 0), GpuKey("node-b", 0)} == set(gpus.states)


def test_a_gpu_is_faulted_when_one_of_its_mig_instances_is() -> None:
    gpus = fleet()
    gpus.observe_scrape(fixture_readings(MIG), now=0.0)
    gpus.observe_scrape(
        [reading(0, host="nvidia-dcgm-exporter-tl46n", instance="8", clock=0x40)], now=15.0
    )

    verdict = gpus.verdicts_for(0, 15.0)

    assert (True, ("MIG 8: hw_thermal clock event",)) == (verdict.faulted, verdict.reasons)
    assert "hw_thermal clock event" == verdict.fault_reason


def test_a_mig_gpu_takes_its_util_from_the_whole_gpu_row() -> None:
    gpus = fleet()
    for now in (0.0, 15.0, 30.0, 45.0):
        gpus.observe_scrape(
            [
                reading(0, util=99),
                reading(0, instance="1", temp=40),
                reading(0, instance="2", temp=40),
            ],
            now,
        )

    assert gpus.verdicts_for(0, 45.0).saturated


def test_a_mig_gpu_without_a_whole_gpu_row_is_never_saturated() -> None:
    gpus = fleet()
    for now in (0.0, 15.0, 30.0, 45.0):
        gpus.observe_scrape(fixture_readings(MIG), now)

    verdict = gpus.verdicts_for(0, 45.0)

    assert (False, False, False) == (verdict.stale, verdict.faulted, verdict.saturated)


def test_a_gpu_is_stale_only_when_every_row_of_it_is() -> None:
    gpus = fleet()
    gpus.observe_scrape([reading(0, instance="1", temp=40)], now=0.0)
    gpus.observe_scrape([reading(0, instance="2", temp=40)], now=60.0)  # MIG reconfigured

    actual = [gpus.verdicts_for(0, now).stale for now in (100.0, 121.0)]

    assert [False, True] == actual


def test_a_gpu_no_scrape_has_shown_is_stale() -> None:
    verdict = fleet().verdicts_for("node-a/3", 0.0)

    assert (True, ("stale: no sample",)) == (verdict.stale, verdict.reasons)


def test_an_upstream_is_saturated_only_when_every_one_of_its_gpus_is() -> None:
    gpus = fleet()
    for now in (0.0, 15.0, 30.0, 45.0):
        gpus.observe_scrape([reading(0, util=99), reading(1, util=99), reading(2, util=20)], now)

    actual = [
        gpus.upstream_saturated([0, 1], 45.0),
        gpus.upstream_saturated([0, 1, 2], 45.0),
        gpus.upstream_saturated([0, 5], 45.0),  # GPU 5 has no state
        gpus.upstream_saturated([], 45.0),  # an upstream without gpu_ids
    ]

    assert [True, False, False, False] == actual


def test_an_upstream_with_a_faulted_gpu_leaves_rotation_only_when_faults_are_coupled() -> None:
    coupled, uncoupled = fleet(), GpuFleetState(TABLE, thresholds(couple_faults=False))
    for gpus in (coupled, uncoupled):
        gpus.observe_scrape([reading(0, row_remap=True), reading(1, row_remap=False)], 0.0)

    actual = (
        coupled.upstream_faulted([0, 1], 0.0),
        coupled.upstream_faulted([1], 0.0),
        uncoupled.upstream_faulted([0, 1], 0.0),
    )

    assert (True, False, False) == actual


def test_an_operator_clear_clears_every_row_of_the_gpu() -> None:
    gpus = fleet()
    gpus.observe_scrape(
        [reading(0, xid=0), reading(0, instance="1", xid=0), reading(0, instance="2", xid=0)], 0.0
    )
    gpus.observe_scrape(
        [reading(0, xid=79), reading(0, instance="1", xid=79), reading(0, instance="2", xid=0)],
        15.0,
    )

    cleared = gpus.clear(0, 20.0)
    gpus.observe_scrape(
        [reading(0, xid=79), reading(0, instance="1", xid=79), reading(0, instance="2", xid=0)],
        30.0,
    )

    assert [GpuKey("node-a", 0), GpuKey("node-a", 0, "1")] == cleared
    assert not gpus.verdicts_for(0, 30.0).faulted


def test_the_fleet_repr_sums_it_up() -> None:
    gpus = fleet()
    gpus.observe_scrape([reading(0, xid=79), reading(1, xid=0)], 0.0)

    assert "<GpuFleetState rows=2 with_fault=1 missing=0>" == repr(gpus)


# a GPU missing from its exporter's scrape; staleness is the exporter's


FALLEN_OFF = "GPU 1 missing from its exporter's scrape (fallen off the bus?)"


def test_a_gpu_missing_from_a_successful_scrape_of_its_exporter_is_faulted_not_stale() -> None:
    """XID 79 often takes the GPU out of dcgm-exporter's output (dcgm-exporter #348)."""
    gpus = fleet()
    gpus.observe_scrape([reading(0, util=10), reading(1, util=10)], now=0.0)
    for now in (15.0, 30.0, 45.0, 60.0, 75.0):
        gpus.observe_scrape([reading(0, util=10)], now)

    verdict = gpus.verdicts_for(1, 75.0)

    assert (False, True, (FALLEN_OFF,)) == (verdict.stale, verdict.faulted, verdict.reasons)
    assert 15.0 == verdict.faulted_since
    assert not gpus.verdicts_for(0, 75.0).faulted


def test_the_missing_gpu_fault_is_refreshed_on_every_scrape_that_still_misses_it() -> None:
    gpus = fleet()  # fault_hold_s 300
    gpus.observe_scrape([reading(0), reading(1)], now=0.0)
    for now in range(15, 616, 15):
        gpus.observe_scrape([reading(0)], float(now))

    assert gpus.verdicts_for(1, 615.0).faulted


def test_a_missing_gpu_that_returns_is_released_fault_hold_s_after_it_was_last_missing() -> None:
    gpus = fleet()
    gpus.observe_scrape([reading(0), reading(1)], now=0.0)
    gpus.observe_scrape([reading(0)], now=15.0)
    for now in range(30, 346, 15):  # back, healthy
        gpus.observe_scrape([reading(0), reading(1)], float(now))

    faulted = [gpus.verdicts_for(1, now).faulted for now in (300.0, 315.0)]

    assert [True, False] == faulted
    assert "missing=0" in repr(gpus)


def test_an_exporter_that_stopped_answering_fails_open_but_a_held_fault_keeps_holding() -> None:
    """Down, timing out or garbage: no successful scrape is reported, so nothing refreshes.
    The healthy GPU fails open; the one missing at 15 s keeps its fault's hold (issue 14 defect
    12b: fail open is for no evidence, not for old evidence of a fault)."""
    gpus = fleet()  # staleness_s 60
    gpus.observe_scrape([reading(0), reading(1)], now=0.0)
    gpus.observe_scrape([reading(0)], now=15.0)  # GPU 1 missing: faulted

    actual = [
        (gpus.verdicts_for(gpu, now).stale, gpus.verdicts_for(gpu, now).faulted)
        for gpu in (0, 1)
        for now in (75.0, 76.0)
    ]

    assert [(False, False), (True, False), (False, True), (True, True)] == actual


def test_a_fault_of_a_missing_gpu_acts_again_when_its_exporter_answers_again() -> None:
    gpus = fleet()
    gpus.observe_scrape([reading(0), reading(1)], now=0.0)
    gpus.observe_scrape([reading(0)], now=15.0)
    gpus.observe_scrape([reading(0)], now=200.0)  # after an outage, still without GPU 1

    verdict = gpus.verdicts_for(1, 200.0)

    assert (False, True, 15.0) == (verdict.stale, verdict.faulted, verdict.faulted_since)


def test_a_scrape_of_one_exporter_never_misses_the_gpus_of_another() -> None:
    gpus = fleet()
    gpus.observe_scrape([reading(0), reading(1)], now=0.0, host="node-a")
    gpus.observe_scrape([reading(0)], now=0.0, host="node-b")
    for now in (15.0, 30.0):
        gpus.observe_scrape([reading(0)], now, host="node-b")

    actual = [gpus.verdicts_for(gpu_id, 30.0).faulted for gpu_id in ("node-a/1", "node-b/0")]

    assert [False, False] == actual
    assert gpus.verdicts_for("node-a/1", 61.0).stale  # node-a's exporter has not answered


def test_a_scrape_without_any_gpu_changes_nothing() -> None:
    """``require_gpus`` keeps such a scrape from the fleet; an empty one would miss no GPU."""
    gpus = fleet()
    gpus.observe_scrape([reading(0), reading(1)], now=0.0)

    gpus.observe_scrape([], now=15.0)

    assert (False, "<GpuFleetState rows=2 with_fault=0 missing=0>") == (
        gpus.verdicts_for(1, 61.0).faulted,
        repr(gpus),
    )
    assert gpus.verdicts_for(1, 61.0).stale


def test_a_mig_gpu_whose_every_instance_is_missing_is_faulted() -> None:
    gpus = fleet()
    gpus.observe_scrape([reading(0), reading(1, instance="1"), reading(1, instance="2")], now=0.0)
    gpus.observe_scrape([reading(0)], now=15.0)

    verdict = gpus.verdicts_for(1, 15.0)

    assert (True, (f"MIG 1: {FALLEN_OFF}", f"MIG 2: {FALLEN_OFF}")) == (
        verdict.faulted,
        verdict.reasons,
    )


def test_a_mig_instance_gone_while_its_gpu_shows_others_is_a_reconfiguration_not_a_fault() -> None:
    gpus = fleet()
    gpus.observe_scrape([reading(0, instance="1"), reading(0, instance="2")], now=0.0)
    for now in (15.0, 30.0, 45.0, 60.0, 75.0):
        gpus.observe_scrape([reading(0, instance="3")], now)

    verdict = gpus.verdicts_for(0, 75.0)

    stale = "stale: no successful scrape of its exporter for 75 s"
    assert (False, False, (f"MIG 1: {stale}", f"MIG 2: {stale}")) == (
        verdict.stale,
        verdict.faulted,
        verdict.reasons,
    )


def test_an_operator_clear_forgets_a_gpu_that_is_missing() -> None:
    """The operator says the GPU is gone: its absence is no longer evidence, as after a restart."""
    gpus = fleet()
    gpus.observe_scrape([reading(0), reading(1)], now=0.0)
    gpus.observe_scrape([reading(0)], now=15.0)

    cleared = gpus.clear(1, now=20.0)
    gpus.observe_scrape([reading(0)], now=30.0)

    assert [GpuKey("node-a", 1)] == cleared
    assert ([], NEVER_SEEN) == (gpus.keys_for(1), gpus.verdicts_for(1, 30.0))
    assert "<GpuFleetState rows=1 with_fault=0 missing=0>" == repr(gpus)


def test_the_fleet_repr_counts_the_missing_rows() -> None:
    gpus = fleet()
    gpus.observe_scrape([reading(0), reading(1), reading(2)], now=0.0)
    gpus.observe_scrape([reading(0)], now=15.0)

    assert "<GpuFleetState rows=3 with_fault=2 missing=2>" == repr(gpus)


def test_a_missing_row_says_since_when_in_its_repr() -> None:
    gpus = fleet()
    gpus.observe_scrape([reading(0), reading(1)], now=0.0)
    gpus.observe_scrape([reading(0)], now=15.0)
    gpus.observe_scrape([reading(0)], now=30.0)

    assert repr(gpus.states[GpuKey("node-a", 1)]).startswith(
        "<GpuState node-a/1 samples=1 util=[] xid=None missing_since=15 fault="
    )
