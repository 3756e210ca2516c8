"""Whatever an exporter answers, the GPU path raises nothing but ScrapeError.

Mutated real scrapes, random text and generated DCGM lines (sentinels, NaN, huge numbers) go
through the whole pure path: ``parse`` → ``readings`` → ``observe``/``assess`` → ``inspect``.
The strategies are in ``gpu_strategies``; ``test_gpu_exposition_parser`` checks the same mangled
scrapes against prometheus_client's parser.
"""

from __future__ import annotations

import json
import math

from gpu_factories import TABLE, dcgm_line, thresholds
from gpu_strategies import PROFILE, TOKENS, format_value, junk_after_a_value, mutated
from hypothesis import given
from hypothesis import strategies as st

from gpugate.adapters.exposition import parse
from gpugate.core.gpu.dcgm import FP64_BLANK, GpuReading, readings
from gpugate.core.gpu.health import GpuFleetState
from gpugate.core.gpu.report import inspect
from gpugate.errors import ScrapeError

SANE = 2**47  # no value in a reading may reach a sentinel's size


def through_the_gpu_path(body: str | bytes) -> list[GpuReading]:
    """Everything a scrape meets on its way to a verdict; ScrapeError is the only way out."""
    found = readings(parse(body))
    gpus = GpuFleetState(TABLE, thresholds(sustained_samples=2))
    for now in (0.0, 15.0):
        gpus.observe_scrape(found, now)
    gpus.observe_scrape(found[::2], 30.0)  # every other row gone: some GPUs missing
    for reading in found:
        gpus.verdict(reading.key, 30.0)
        gpus.verdicts_for(reading.key.gpu, 30.0)
    json.dumps(inspect(found, TABLE, thresholds()), allow_nan=False)
    return found


def sane(reading: GpuReading) -> bool:
    numbers = [
        reading.util_pct,
        reading.temp_c,
        reading.last_xid,
        reading.clock_reasons,
        reading.health,
        *reading.xid_counts.keys(),
        *reading.xid_counts.values(),
    ]
    return all(n is None or (math.isfinite(n) and -SANE < n < SANE) for n in numbers)


def survives(body: str | bytes) -> bool:
    try:
        found = through_the_gpu_path(body)
    except ScrapeError:
        return True
    return all(sane(reading) for reading in found)


@PROFILE
@given(mutated())
def test_mutated_real_scrapes_raise_nothing_but_scrape_error(body: str | bytes) -> None:
    assert survives(body)


@PROFILE
@given(junk_after_a_value())
def test_junk_after_a_value_raises_nothing_but_scrape_error(body: str) -> None:
    assert survives(body)


@PROFILE
@given(st.lists(st.sampled_from(TOKENS) | st.characters(), max_size=80).map("".join))
def test_random_text_raises_nothing_but_scrape_error(body: str) -> None:
    assert survives(body)


VALUES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        [0x7FFFFFFFFFFFFFF0, 0x7FFFFFFFFFFFFFF2, FP64_BLANK, FP64_BLANK + 2, 10**400, -(10**400)]
    ),
)
NAMES = st.sampled_from(
    [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_EXP_XID_ERRORS_COUNT",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_EXP_GPU_HEALTH_STATUS",
    ]
)
INDEXES = st.one_of(st.integers(0, 9).map(str), st.sampled_from(["", "x", "9" * 12, "9" * 5000]))


@PROFILE
@given(
    st.lists(st.tuples(NAMES, VALUES, st.integers(0, 3), INDEXES, INDEXES), min_size=1, max_size=12)
)
def test_generated_dcgm_values_never_become_sentinel_sized_readings(
    lines: list[tuple[str, float, int, str, str]],
) -> None:
    body = "\n".join(
        dcgm_line(name, format_value(value), gpu=gpu, xid=xid, GPU_I_ID=instance)
        for name, value, gpu, xid, instance in lines
    )

    assert survives(body)


@PROFILE
@given(
    st.dictionaries(
        st.integers(0, 7),
        st.tuples(st.floats(0, 100), st.floats(-20, 120)),
        min_size=1,
        max_size=8,
    )
)
def test_util_and_temperature_come_out_as_the_text_holds_them(
    gpus: dict[int, tuple[float, float]],
) -> None:
    body = "\n".join(
        line
        for gpu, (util, temp) in gpus.items()
        for line in (
            dcgm_line("DCGM_FI_DEV_GPU_UTIL", repr(util), gpu=gpu),
            dcgm_line("DCGM_FI_DEV_GPU_TEMP", repr(temp), gpu=gpu),
        )
    )

    found = readings(parse(body))

    assert sorted(gpus.items()) == [(r.key.gpu, (r.util_pct, r.temp_c)) for r in found]
