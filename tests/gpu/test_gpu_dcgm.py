from __future__ import annotations

from collections.abc import Iterator

import pytest
from gpu_factories import dcgm_line, scrape

from gpugate.adapters.exposition import Sample, parse
from gpugate.core.gpu.dcgm import (
    FP64_BLANK,
    INT64_BLANK,
    GpuKey,
    is_blank,
    readings,
)

UTIL = "DCGM_FI_DEV_GPU_UTIL"
TEMP = "DCGM_FI_DEV_GPU_TEMP"
XID = "DCGM_FI_DEV_XID_ERRORS"
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
HEALTH = "DCGM_EXP_GPU_HEALTH_STATUS"


# keys and labels


def test_the_host_is_the_hostname_label_in_either_case() -> None:
    found = scrape(
        dcgm_line(UTIL, 10, gpu=0, host="node-a", host_label="Hostname"),
        dcgm_line(UTIL, 20, gpu=1, host="node-b", host_label="hostname"),
    )

    assert [GpuKey("node-a", 0), GpuKey("node-b", 1)] == [r.key for r in found]


def test_samples_made_one_at_a_time_with_fresh_labels_each_go_to_their_own_gpu() -> None:
    """readings() works a label set out once per mapping; a generator's mappings die young."""

    def one_at_a_time() -> Iterator[Sample]:
        for gpu in range(50):
            yield Sample(UTIL, {"gpu": str(gpu), "Hostname": "node-a"}, float(gpu))

    found = readings(one_at_a_time())

    assert [(gpu, float(gpu)) for gpu in range(50)] == [(r.key.gpu, r.util_pct) for r in found]


def test_a_gpu_without_a_host_label_has_no_host() -> None:
    (found,) = scrape(dcgm_line(UTIL, 10, host=None))

    assert GpuKey(None, 0) == found.key


def test_the_operator_host_overrides_the_label() -> None:
    (found,) = readings(parse(dcgm_line(UTIL, 10, host="ip-10-0-0-1")), host="node-a")

    assert GpuKey("node-a", 0) == found.key


def test_an_empty_operator_host_keeps_the_label() -> None:
    """The one exporter of ``dcgm_url`` has host "" in the config: not a name."""
    (found,) = readings(parse(dcgm_line(UTIL, 10, host="ip-10-0-0-1")), host="")

    assert GpuKey("ip-10-0-0-1", 0) == found.key


def test_mig_instances_are_keyed_by_gpu_i_id_whole_gpu_first() -> None:
    found = scrape(
        dcgm_line(TEMP, 35, GPU_I_ID="9", GPU_I_PROFILE="1g.5gb"),
        dcgm_line(TEMP, 35, GPU_I_ID="10", GPU_I_PROFILE="1g.5gb"),
        dcgm_line(UTIL, 50),
        dcgm_line(TEMP, 35, GPU_I_ID="5", GPU_I_PROFILE="2g.10gb"),
    )

    assert [None, "5", "9", "10"] == [r.key.instance for r in found]
    assert [50, None, None, None] == [r.util_pct for r in found]


def test_samples_without_a_gpu_label_or_outside_dcgm_belong_to_no_gpu() -> None:
    found = readings(
        [
            _sample("DCGM_FI_DEV_ROW_REMAP_FAILURE", {}, 1),
            _sample("DCGM_FI_DEV_GPU_TEMP", {"gpu": "zero"}, 99),
            _sample("vllm:num_requests_running", {"gpu": "0"}, 3),
        ]
    )

    assert [] == found


def test_readings_are_sorted_by_host_then_index() -> None:
    found = scrape(
        dcgm_line(UTIL, 1, gpu=10, host="b"),
        dcgm_line(UTIL, 1, gpu=2, host="b"),
        dcgm_line(UTIL, 1, gpu=1, host="a"),
    )

    assert ["a/1", "b/2", "b/10"] == [str(r.key) for r in found]


# absent is unknown, never 0


def test_an_absent_series_is_none_not_zero() -> None:
    (found,) = scrape(dcgm_line(UTIL, 0))

    actual = (
        found.temp_c,
        found.last_xid,
        found.clock_reasons,
        found.row_remap_failure,
        found.health,
    )
    assert (None, None, None, None, None) == actual
    assert {} == found.xid_counts
    assert 0 == found.util_pct


# sentinels


@pytest.mark.parametrize(
    "value",
    [
        "9223372036854775792",  # INT64_BLANK
        "9223372036854775794",  # NOT_SUPPORTED, as old exporters printed for MEMORY_TEMP
        "140737488355328",  # FP64_BLANK as an integer
        "140737488355330.0",  # FP64 NOT_SUPPORTED
        "NaN",
        "+Inf",
        "-Inf",
    ],
)
def test_dcgm_blank_sentinels_and_non_numbers_are_missing_values(value: str) -> None:
    (found,) = scrape(
        dcgm_line(UTIL, value),
        dcgm_line(TEMP, value),
        dcgm_line(XID, value),
        dcgm_line("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", value),
    )

    assert (None, None, None, None) == (
        found.util_pct,
        found.temp_c,
        found.last_xid,
        found.clock_reasons,
    )


def test_is_blank_marks_both_sentinel_bounds_and_not_what_is_below() -> None:
    actual = [is_blank(v) for v in (INT64_BLANK, FP64_BLANK, FP64_BLANK - 1, 100.0, -FP64_BLANK)]

    assert [True, True, False, False, True] == actual


# XID


def test_the_last_xid_value_is_read_with_or_without_err_labels() -> None:
    found = scrape(
        dcgm_line(XID, 79, gpu=0, err_code="79", err_msg="GPU has fallen off the bus"),
        dcgm_line(XID, 0, gpu=1),
        dcgm_line("DCGM_FI_DEV_XID_ERROR", 48, gpu=2),  # DCGM 4.6's name for the field
    )

    assert [79, 0, 48] == [r.last_xid for r in found]


def test_an_xid_value_that_is_not_a_whole_number_is_missing() -> None:
    found = scrape(dcgm_line(XID, 79.5, gpu=0), dcgm_line(XID, -1, gpu=1))

    assert [None, None] == [r.last_xid for r in found]


def test_xid_counts_are_read_per_code_and_the_zero_series_without_xid_adds_nothing() -> None:
    window = {"window_size_in_ms": "300000"}
    found = scrape(
        dcgm_line(XID_COUNT, 0, gpu=0, **window),
        dcgm_line(XID_COUNT, 2, gpu=1, **window, xid="79"),
        dcgm_line(XID_COUNT, 1, gpu=1, **window, xid="13"),
    )

    assert [{}, {13: 1, 79: 2}] == [dict(r.xid_counts) for r in found]


# clock events, row remap, health


def test_the_clock_event_bitmask_is_read_under_the_new_and_the_old_name() -> None:
    found = scrape(
        dcgm_line("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 64, gpu=0),
        dcgm_line("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 1, gpu=1),
    )

    assert [64, 1] == [r.clock_reasons for r in found]


def test_the_row_remap_failure_flag_is_true_only_for_one() -> None:
    found = scrape(
        dcgm_line("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1, gpu=0),
        dcgm_line("DCGM_FI_DEV_ROW_REMAP_FAILURE", 0, gpu=1),
        dcgm_line("DCGM_FI_DEV_ROW_REMAP_FAILURE", 7, gpu=2),
    )

    assert [True, False, None] == [r.row_remap_failure for r in found]


def test_health_keeps_the_worst_watch_result_and_which_watches_said_it() -> None:
    (found,) = scrape(
        dcgm_line(HEALTH, 0, health_watch="PCIE", health_error_code="DCGM_FR_OK"),
        dcgm_line(HEALTH, 20, health_watch="ALL", health_error_code="DCGM_FR_XID_ERROR"),
        dcgm_line(HEALTH, 10, health_watch="THERMAL", health_error_code="DCGM_FR_TEMP"),
        dcgm_line(HEALTH, 20, health_watch="MEM", health_error_code="DCGM_FR_DBE"),
    )

    assert (20, ("ALL", "MEM")) == (found.health, found.health_watches)


def test_a_health_value_outside_pass_warn_fail_is_ignored() -> None:
    (found,) = scrape(dcgm_line(HEALTH, 15, health_watch="ALL"))

    assert found.health is None


def _sample(name: str, labels: dict[str, str], value: float) -> _Plain:
    return _Plain(name, labels, value)


class _Plain:
    """A sample that is not the adapter's: readings() takes anything shaped like one."""

    def __init__(self, name: str, labels: dict[str, str], value: float) -> None:
        self.name, self.labels, self.value = name, labels, value
