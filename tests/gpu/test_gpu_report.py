"""``gpugate gpus inspect --json`` entries for one scrape (DESIGN §7)."""

from __future__ import annotations

import json

import pytest
from gpu_factories import TABLE, dcgm_line, fed, reading, scrape, thresholds

from gpugate.core.gpu.dcgm import GpuReading
from gpugate.core.gpu.report import NOTHING_TO_JUDGE, inspect, live_entry
from gpugate.core.gpu.xid import XidTable

XID_79 = "XID 79 (GPU_HAS_FALLEN_OFF_THE_BUS): fatal"

CONTRACT_FIELDS = {
    "host",
    "gpu",
    "instance",
    "uuid",
    "model",
    "util_pct",
    "temp_c",
    "last_xid",
    "clock_reasons",
    "verdict",
    "reasons",
}


def entry(**series: object) -> dict[str, object]:
    (only,) = inspect([reading(**series)], TABLE, thresholds())  # type: ignore[arg-type]
    return only


def test_an_entry_has_every_contract_field_and_is_json() -> None:
    (found,) = inspect(
        scrape(dcgm_line("DCGM_FI_DEV_GPU_UTIL", 91), dcgm_line("DCGM_FI_DEV_GPU_TEMP", 74)),
        TABLE,
        thresholds(),
    )

    assert CONTRACT_FIELDS <= set(found)
    assert {
        "host": "node-a",
        "gpu": 0,
        "instance": None,
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "model": "NVIDIA H100 80GB HBM3",
        "util_pct": 91,
        "temp_c": 74,
        "last_xid": None,
        "clock_reasons": [],
        "verdict": "ok",
        "reasons": [],
    } == {field: found[field] for field in CONTRACT_FIELDS}
    assert found == json.loads(json.dumps(found))


def test_a_fatal_last_xid_is_faulted_as_if_seen_at_start() -> None:
    found = entry(xid=79)

    assert ("faulted", ["XID 79 (GPU_HAS_FALLEN_OFF_THE_BUS): fatal"]) == (
        found["verdict"],
        found["reasons"],
    )


@pytest.mark.parametrize(
    ("code", "note"),
    [
        (94, "XID 94 (CONTAINED_ERROR): not fatal"),
        (63, "XID 63 (INFOROM_DRAM_RETIREMENT_EVENT): not fatal"),
        (200, "unknown XID 200"),
    ],
)
def test_a_non_fatal_or_unknown_xid_is_ok_and_still_shown(code: int, note: str) -> None:
    found = entry(xid=code)

    assert ("ok", [note]) == (found["verdict"], found["reasons"])


def test_xid_zero_is_ok_without_a_reason() -> None:
    assert ("ok", []) == (entry(xid=0)["verdict"], entry(xid=0)["reasons"])


def test_a_gpu_with_none_of_the_series_a_verdict_reads_is_unknown() -> None:
    found = entry(util=50)

    assert (None, "unknown", [NOTHING_TO_JUDGE]) == (
        found["last_xid"],
        found["verdict"],
        found["reasons"],
    )


def test_a_temperature_alone_is_judged_only_when_max_temp_c_is_set() -> None:
    (without_limit,) = inspect([reading(temp=50)], TABLE, thresholds(max_temp_c=None))

    assert ("ok", "unknown") == (entry(temp=50)["verdict"], without_limit["verdict"])


@pytest.mark.parametrize(
    ("series", "reason"),
    [
        ({"clock": 0x48}, ["hw_slowdown clock event", "hw_thermal clock event"]),
        ({"temp": 93}, ["temperature 93 °C ≥ 90"]),
        ({"row_remap": True}, ["row remap failure"]),
        ({"health": 20, "watches": ("ALL",)}, ["DCGM health FAIL (watch ALL)"]),
        (
            {"xid_counts": {48: 2}},
            ["XID 48 (GPU_ECC_DBE): fatal (2 in the exporter's count window)"],
        ),
    ],
)
def test_each_kind_of_fault_evidence_faults_the_entry(
    series: dict[str, object], reason: list[str]
) -> None:
    found = entry(**series)

    assert ("faulted", reason) == (found["verdict"], found["reasons"])


def test_clock_reasons_are_decoded_names_and_idle_is_ok() -> None:
    found = entry(clock=0x5)

    assert (["gpu_idle", "power_cap"], "ok") == (found["clock_reasons"], found["verdict"])


def test_dcgm_health_warn_is_ok_and_shown() -> None:
    found = entry(health=10, watches=("THERMAL",))

    assert ("ok", ["DCGM health WARN (watch THERMAL)"], "WARN") == (
        found["verdict"],
        found["reasons"],
        found["health"],
    )


def test_an_override_changes_the_verdict_of_inspect_too() -> None:
    (found,) = inspect([reading(xid=109)], XidTable.load({109: "fatal"}), thresholds())

    assert "faulted" == found["verdict"]


def test_mig_instances_are_entries_of_their_own() -> None:
    found = inspect(
        scrape(
            dcgm_line("DCGM_FI_DEV_GPU_TEMP", 35, GPU_I_ID="7", GPU_I_PROFILE="1g.5gb"),
            dcgm_line("DCGM_FI_DEV_XID_ERRORS", 95, GPU_I_ID="7", GPU_I_PROFILE="1g.5gb"),
            dcgm_line("DCGM_FI_DEV_GPU_TEMP", 35, GPU_I_ID="8", GPU_I_PROFILE="1g.5gb"),
        ),
        TABLE,
        thresholds(),
    )

    assert [("7", "1g.5gb", "faulted"), ("8", "1g.5gb", "ok")] == [
        (e["instance"], e["profile"], e["verdict"]) for e in found
    ]


def test_fractional_values_stay_numbers() -> None:
    found = entry(util=12.5, temp=40.25)

    assert (12.5, 40.25) == (found["util_pct"], found["temp_c"])


# live_entry: the same entry for a GPU the monitor follows, with the fault it holds


def live(steps: list[tuple[float, GpuReading]], now: float, **limits: float) -> dict[str, object]:
    """The live entry at ``now`` of a state fed ``steps``, for its newest reading."""
    found = live_entry(fed(steps, thresholds(**limits)), now, TABLE, thresholds(**limits))
    assert found is not None
    return found


def without_live(found: dict[str, object]) -> dict[str, object]:
    live_only = {"stale", "saturated", "fault_reason", "faulted_since"}
    return {key: value for key, value in found.items() if key not in live_only}


def test_a_live_entry_of_one_sample_is_the_inspect_entry_plus_the_monitor_s_state() -> None:
    one = reading(xid=79, temp=55)
    (inspected,) = inspect([one], TABLE, thresholds(), now=10.0)

    found = live([(10.0, one)], now=10.0)

    assert inspected == without_live(found)
    assert (False, False, XID_79, 10.0) == (
        found["stale"],
        found["saturated"],
        found["fault_reason"],
        found["faulted_since"],
    )


def test_a_held_fault_is_faulted_while_the_newest_reading_alone_is_ok() -> None:
    newest = reading(xid=13, temp=50)
    (alone,) = inspect([newest], TABLE, thresholds())

    found = live([(0.0, reading(xid=79)), (15.0, newest)], now=15.0)

    assert ("ok", ["XID 13 (GR_EXCEPTION): not fatal"]) == (alone["verdict"], alone["reasons"])
    assert {**alone, "verdict": "faulted", "reasons": [XID_79, *alone["reasons"]]} == (
        without_live(found)
    )


def test_a_fault_whose_hold_ran_out_is_inspect_s_ok_although_the_sticky_xid_is_fatal() -> None:
    """The sticky value alone, as a first sample, would fault; to the monitor it is no news."""
    found = live([(0.0, reading(xid=79)), (400.0, reading(xid=79))], now=400.0)

    assert ("ok", [], None) == (found["verdict"], found["reasons"], found["fault_reason"])


def test_the_stale_reason_follows_inspect_s_reasons() -> None:
    found = live([(0.0, reading(util=50))], now=61.0)

    assert (
        "unknown",
        [NOTHING_TO_JUDGE, "stale: no successful scrape of its exporter for 61 s"],
    ) == (
        found["verdict"],
        found["reasons"],
    )
