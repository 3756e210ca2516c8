"""The seed's rules for one GPU: saturation, staleness, XID memory, thermal and other faults."""

from __future__ import annotations

import pytest
from gpu_factories import TABLE, fed, polls, reading, thresholds

from gpugate.core.gpu.dcgm import GpuReading
from gpugate.core.gpu.health import (
    GpuState,
    GpuVerdict,
    assess,
    clear,
    decode_clock_reasons,
    observe,
    upstream_faulted,
    upstream_saturated,
)
from gpugate.core.gpu.xid import XidTable

LIMITS = thresholds()  # staleness 60 s, 4 samples, 95 %, hold 300 s, max 90 °C


def verdict_after(steps: list[tuple[float, GpuReading]], now: float) -> GpuVerdict:
    return assess(fed(steps), now, LIMITS)


def xid_steps(*values: int | None, every: float = 15.0) -> list[tuple[float, GpuReading]]:
    """One poll per value: the GPU's last-XID series (None = the series is absent)."""
    return [(i * every, reading(xid=value)) for i, value in enumerate(values)]


# saturation


def test_batch_is_shed_when_all_four_fresh_samples_are_at_or_above_95() -> None:
    verdict = verdict_after(polls([95, 96, 99, 100]), now=45)

    assert (True, ("util ≥ 95 % in the last 4 samples",)) == (verdict.saturated, verdict.reasons)


def test_three_of_four_samples_at_or_above_the_threshold_is_not_saturated() -> None:
    verdict = verdict_after(polls([99, 99, 94, 99]), now=45)

    assert not verdict.saturated


def test_three_samples_do_not_fill_the_ring() -> None:
    verdict = verdict_after(polls([100, 100, 100]), now=30)

    assert not verdict.saturated


def test_the_newest_samples_decide_once_the_ring_is_full() -> None:
    verdict = verdict_after(polls([50, 99, 99, 99, 99]), now=60)

    assert verdict.saturated


def test_one_missed_poll_keeps_the_ring() -> None:
    verdict = verdict_after(polls([99, 99, None, 99, 99]), now=60)

    assert verdict.saturated


def test_staleness_resets_the_ring() -> None:
    """75 s without a sample: the three old utils no longer count towards the four."""
    steps = [*polls([99, 99, 99]), (105.0, reading(util=99))]

    state = fed(steps)

    assert (1, False) == (len(state.util), assess(state, 105, LIMITS).saturated)


def test_a_saturated_gpu_is_not_saturated_once_stale() -> None:
    """Fail open: 75 s after the last of four hot samples nothing sheds."""
    verdict = verdict_after(polls([99, 99, 99, 99]), now=45 + 75)

    assert (
        GpuVerdict(
            stale=True,
            faulted=False,
            saturated=False,
            reasons=("stale: no successful scrape of its exporter for 75 s",),
        )
        == verdict
    )


def test_a_gpu_never_seen_is_stale_and_not_saturated() -> None:
    expected = GpuVerdict(stale=True, faulted=False, saturated=False, reasons=("stale: no sample",))
    assert expected == assess(None, 0.0, LIMITS)


def test_utils_that_stopped_arriving_do_not_saturate_a_gpu_still_reporting_other_series() -> None:
    steps = [*polls([99, 99, 99, 99]), (120.0, reading(temp=40))]

    verdict = verdict_after(steps, now=120)

    assert (False, False) == (verdict.stale, verdict.saturated)


def test_the_upstream_is_saturated_only_when_every_one_of_its_gpus_is() -> None:
    hot = GpuVerdict(stale=False, faulted=False, saturated=True)
    cool = GpuVerdict(stale=False, faulted=False, saturated=False)
    never_seen = assess(None, 0.0, LIMITS)

    actual = [
        upstream_saturated([hot, hot]),
        upstream_saturated([hot, cool]),
        upstream_saturated([hot, never_seen]),
        upstream_saturated([]),  # an upstream without gpu_ids
    ]

    assert [True, False, False, False] == actual


def test_an_upstream_leaves_rotation_for_a_faulted_gpu_only_when_faults_are_coupled() -> None:
    faulted = [GpuVerdict(stale=False, faulted=True, saturated=False)]

    actual = (
        upstream_faulted(faulted, thresholds(couple_faults=True)),
        upstream_faulted(faulted, thresholds(couple_faults=False)),
    )

    assert (True, False) == actual


# faults hold, staleness fails open


def test_a_fault_holds_for_fault_hold_s_after_its_last_evidence() -> None:
    """The XID changed at 15 s; fresh polls keep showing the sticky value: it holds to 315 s."""
    state = fed(xid_steps(0, 79))
    faulted = {}
    for now in range(30, 346, 15):  # fresh samples, the sticky XID unchanged
        observe(state, reading(xid=79), now, TABLE, LIMITS)
        faulted[now] = assess(state, now, LIMITS).faulted

    assert {now: now < 315 for now in faulted} == faulted


def test_a_fault_inside_its_hold_keeps_holding_while_the_data_is_stale() -> None:
    """Issue 14 defect 12b: on main a faulted GPU behind a hung exporter went back into
    rotation once its data went stale, while its hold was still running."""
    state = fed([(0.0, reading(xid=0)), (15.0, reading(xid=79))])

    verdict = assess(state, 90.0, LIMITS)

    assert (True, True) == (verdict.stale, verdict.faulted)
    assert "XID 79 (GPU_HAS_FALLEN_OFF_THE_BUS): fatal" == verdict.fault_reason


def test_a_stale_fault_ends_with_its_hold_and_the_gpu_then_fails_open() -> None:
    state = fed([(0.0, reading(xid=0)), (15.0, reading(xid=79))])

    held, ended = assess(state, 314.0, LIMITS), assess(state, 315.0, LIMITS)

    assert (True, True) == (held.stale, held.faulted)
    assert (True, False, None) == (ended.stale, ended.faulted, ended.fault_reason)


def test_a_stale_gpu_without_a_fault_fails_open() -> None:
    state = fed([(0.0, reading(xid=0)), (15.0, reading(xid=0, util=99)), (30.0, reading(util=99))])

    verdict = assess(state, 200.0, LIMITS)

    assert (True, False, False) == (verdict.stale, verdict.faulted, verdict.saturated)


def test_a_fault_inside_its_hold_still_holds_when_fresh_data_returns() -> None:
    state = fed([(0.0, reading(xid=0)), (15.0, reading(xid=79))])
    assert assess(state, 120.0, LIMITS).faulted  # stale, still held

    observe(state, reading(xid=79), 130.0, TABLE, LIMITS)

    verdict = assess(state, 130.0, LIMITS)
    assert (True, 15.0) == (verdict.faulted, verdict.faulted_since)


def test_a_fault_whose_hold_ran_out_during_an_outage_does_not_come_back() -> None:
    state = fed([(0.0, reading(xid=0)), (15.0, reading(xid=79))])

    observe(state, reading(xid=79), 400.0, TABLE, LIMITS)

    assert not assess(state, 400.0, LIMITS).faulted


# XID


def test_a_change_to_a_fatal_xid_faults() -> None:
    verdict = verdict_after(xid_steps(0, 0, 48), now=30)

    assert (True, ("XID 48 (GPU_ECC_DBE): fatal",)) == (verdict.faulted, verdict.reasons)


@pytest.mark.parametrize("code", [94, 63, 92, 13, 31, 43, 45, 109])
def test_a_change_to_a_non_fatal_xid_does_not_fault(code: int) -> None:
    verdict = verdict_after(xid_steps(0, code), now=15)

    assert not verdict.faulted


def test_a_change_to_an_unknown_xid_does_not_fault() -> None:
    state = fed(xid_steps(0, 200))

    assert (False, 200) == (assess(state, 15, LIMITS).faulted, state.last_xid)


def test_a_fatal_xid_seen_at_start_up_faults() -> None:
    """The gateway starts after the XID happened: the first value seen counts as new."""
    verdict = verdict_after(xid_steps(79), now=0)

    assert verdict.faulted


def test_an_absent_xid_series_is_unknown_not_zero() -> None:
    state = fed(xid_steps(None, None))

    assert (None, False) == (state.last_xid, assess(state, 15, LIMITS).faulted)


def test_an_xid_series_that_appears_late_with_a_fatal_code_faults() -> None:
    """Nothing was known before, so the first value seen is "seen at start"."""
    verdict = verdict_after(xid_steps(None, None, 79), now=30)

    assert verdict.faulted


def test_a_sticky_unchanged_xid_does_not_fault_again_after_the_hold() -> None:
    """Seen at start at 0 s, then twenty minutes of the same value: faulted for the hold only."""
    state = GpuState(reading().key)
    faulted = {}
    for now in range(0, 1200, 15):
        observe(state, reading(xid=79), now, TABLE, LIMITS)
        faulted[now] = assess(state, now, LIMITS).faulted

    assert {now: now < 300 for now in faulted} == faulted


def test_a_sticky_unchanged_xid_does_not_fault_again_after_an_operator_clear() -> None:
    state = fed(xid_steps(0, 79))
    assert assess(state, 15, LIMITS).faulted

    clear(state, 20.0)
    for now in (30.0, 45.0, 60.0):
        observe(state, reading(xid=79), now, TABLE, LIMITS)

    assert (False, 79) == (assess(state, 60, LIMITS).faulted, state.cleared_xid)


def test_an_exporter_restart_then_the_same_fatal_xid_faults_again() -> None:
    """A restart resets the value to 0; the same code afterwards is a change."""
    state = fed(xid_steps(0, 79))
    clear(state, 20.0)

    observe(state, reading(xid=0), 30.0, TABLE, LIMITS)  # the exporter restarted
    observe(state, reading(xid=79), 45.0, TABLE, LIMITS)

    verdict = assess(state, 45, LIMITS)
    assert (True, 45.0) == (verdict.faulted, verdict.faulted_since)


def test_xid_memory_is_kept_across_an_exporter_outage() -> None:
    """Stale for ten minutes, then the same sticky value: nothing new happened."""
    state = fed(xid_steps(0, 79))

    observe(state, reading(xid=79), 15.0 + 600, TABLE, LIMITS)

    assert not assess(state, 615, LIMITS).faulted


def test_xid_memory_is_kept_across_polls_where_the_series_is_absent() -> None:
    state = fed(xid_steps(0, 79, None, None))
    clear(state, 50.0)

    observe(state, reading(xid=79), 60.0, TABLE, LIMITS)

    assert not assess(state, 60, LIMITS).faulted


def test_a_rising_count_of_a_fatal_xid_faults() -> None:
    verdict = verdict_after(
        [(0.0, reading(xid=79, xid_counts={})), (15.0, reading(xid=79, xid_counts={79: 1}))],
        now=15,
    )

    assert (
        "XID 79 (GPU_HAS_FALLEN_OFF_THE_BUS): fatal (1 in the exporter's count window)",
    ) == verdict.reasons[1:]


def test_an_unchanged_count_does_not_fault_again_after_a_clear() -> None:
    state = fed([(0.0, reading(xid_counts={95: 1}))])
    clear(state, 5.0)

    observe(state, reading(xid_counts={95: 1}), 15.0, TABLE, LIMITS)
    assert not assess(state, 15, LIMITS).faulted

    observe(state, reading(xid_counts={95: 2}), 30.0, TABLE, LIMITS)
    assert assess(state, 30, LIMITS).faulted


def test_a_count_of_a_non_fatal_xid_does_not_fault() -> None:
    verdict = verdict_after([(0.0, reading(xid_counts={13: 5}))], now=0)

    assert not verdict.faulted


def test_an_override_decides_what_a_change_means() -> None:
    table = XidTable.load({109: "fatal", 79: "nonfatal"})
    state = GpuState(reading().key)
    for now, code in ((0.0, 0), (15.0, 79), (30.0, 109)):
        observe(state, reading(xid=code), now, table, LIMITS)

    assert ("XID 109 (CTXSW_TIMEOUT_ERROR): fatal (override)",) == assess(state, 30, LIMITS).reasons


# thermal, row remap, health


@pytest.mark.parametrize(
    ("mask", "reason"),
    [
        (0x40, "hw_thermal clock event"),
        (0x08, "hw_slowdown clock event"),
        (0x41, "hw_thermal clock event"),  # idle and thermal: the thermal bit counts
    ],
)
def test_hw_thermal_and_hw_slowdown_clock_events_fault(mask: int, reason: str) -> None:
    verdict = verdict_after([(0.0, reading(clock=mask))], now=0)

    assert (True, (reason,)) == (verdict.faulted, verdict.reasons)


@pytest.mark.parametrize("mask", [0x0, 0x1, 0x2, 0x4, 0x20, 0x80, 0x100])
def test_gpu_idle_and_the_other_clock_events_do_not_fault(mask: int) -> None:
    verdict = verdict_after([(0.0, reading(clock=mask))], now=0)

    assert not verdict.faulted


def test_a_temperature_at_max_temp_c_faults_and_one_degree_below_does_not() -> None:
    actual = [verdict_after([(0.0, reading(temp=t))], now=0).reasons for t in (90, 89, 93)]

    assert [("temperature 90 °C ≥ 90",), (), ("temperature 93 °C ≥ 90",)] == actual


def test_without_max_temp_c_no_temperature_faults() -> None:
    state = fed([(0.0, reading(temp=120))], thresholds(max_temp_c=None))

    assert not assess(state, 0, LIMITS).faulted


def test_continuing_thermal_evidence_refreshes_the_hold_and_keeps_since() -> None:
    """Throttling at 0, 15 and 30 s, then cool: the fault holds 300 s after 30 s, since 0 s."""
    hot = [(t, reading(clock=0x40)) for t in (0.0, 15.0, 30.0)]
    cool = [(float(t), reading(clock=0x1)) for t in range(45, 346, 15)]
    state = fed(hot + cool)

    actual = [(v.faulted, v.faulted_since) for v in (assess(state, t, LIMITS) for t in (329, 330))]

    assert [(True, 0.0), (False, None)] == actual


def test_thermal_evidence_after_a_clear_faults_again_at_the_next_scrape() -> None:
    state = fed([(0.0, reading(clock=0x40))])
    clear(state, 5.0)
    assert not assess(state, 5, LIMITS).faulted

    observe(state, reading(clock=0x40), 15.0, TABLE, LIMITS)

    assert (True, 15.0) == (
        assess(state, 15, LIMITS).faulted,
        assess(state, 15, LIMITS).faulted_since,
    )


def test_a_row_remap_failure_faults() -> None:
    verdict = verdict_after([(0.0, reading(row_remap=True))], now=0)

    assert ("row remap failure",) == verdict.reasons


def test_dcgm_health_fail_faults_and_warn_does_not() -> None:
    failed = verdict_after([(0.0, reading(health=20, watches=("ALL",)))], now=0)
    warned = verdict_after([(0.0, reading(health=10, watches=("THERMAL",)))], now=0)

    assert (("DCGM health FAIL (watch ALL)",), False) == (failed.reasons, warned.faulted)


def test_reasons_of_a_fault_accumulate_while_it_holds() -> None:
    state = fed([(0.0, reading(xid=79)), (15.0, reading(xid=79, temp=95))])

    assert (
        "XID 79 (GPU_HAS_FALLEN_OFF_THE_BUS): fatal; temperature 95 °C ≥ 90"
        == assess(state, 15, LIMITS).fault_reason
    )


def test_a_newer_reason_of_the_same_kind_replaces_the_older_one() -> None:
    """An hour-long thermal fault says the temperature now, not every temperature it had."""
    state = fed([(0.0, reading(temp=93)), (15.0, reading(temp=97)), (30.0, reading(temp=95))])

    assert ("temperature 95 °C ≥ 90",) == assess(state, 30, LIMITS).reasons


def test_the_state_shows_the_newest_reading() -> None:
    state = fed([(0.0, reading(temp=93, clock=0x41, row_remap=False, health=10))])

    assert (93, ["gpu_idle", "hw_thermal"], False, 10) == (
        state.temp_c,
        state.clock_reasons,
        state.row_remap_failure,
        state.health,
    )


# clock reasons


def test_clock_reasons_decode_in_bit_order_with_the_exporters_names() -> None:
    assert [
        "gpu_idle",
        "clocks_setting",
        "power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal",
        "hw_thermal",
        "hw_power_brake",
        "display_clocks",
    ] == decode_clock_reasons(0x1FF)


def test_an_unnamed_clock_reason_bit_shows_as_hex() -> None:
    assert ["hw_thermal", "0x200"] == decode_clock_reasons(0x240)


def test_no_clock_reason_is_an_empty_list() -> None:
    assert [] == decode_clock_reasons(0)


def test_the_state_repr_sums_it_up() -> None:
    state = fed([*polls([97, 99]), (30.0, reading(xid=79))])

    assert (
        "<GpuState node-a/0 samples=3 util=[97,99] xid=79"
        " fault='XID 79 (GPU_HAS_FALLEN_OFF_THE_BUS): fatal'>"
    ) == repr(state)
