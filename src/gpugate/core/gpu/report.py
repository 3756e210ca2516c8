"""``gpugate gpus inspect --json``: one scrape's GPUs as JSON-ready entries (DESIGN §7).

One entry per GPU and per MIG instance. The verdict judges the scrape as if it were the first
sample this gateway saw of each GPU (so a fatal sticky XID counts, as "seen at start" does):
``faulted`` on a fatal XID, an HW thermal/slowdown clock event, ``temp ≥ max_temp_c``, a row-remap
failure or DCGM health FAIL; ``unknown`` when the scrape holds none of the series a verdict reads;
``ok`` otherwise. Saturation needs several samples and is not judged here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpugate.core.gpu.dcgm import HEALTH_NAMES, HEALTH_WARN, GpuReading
from gpugate.core.gpu.health import GpuState, Thresholds, assess, decode_clock_reasons, observe
from gpugate.core.gpu.xid import XidTable

NOTHING_TO_JUDGE = "no XID, clock-event, temperature, row-remap or health series"


def inspect(
    readings: Iterable[GpuReading], table: XidTable, thresholds: Thresholds, now: float = 0.0
) -> list[dict[str, Any]]:
    """The ``gpus`` entries for one scrape's readings, in the readings' order."""
    return [_entry(reading, table, thresholds, now) for reading in readings]


def reading_fields(reading: GpuReading) -> dict[str, Any]:
    """What a scrape says about one GPU, as JSON: the fields every GPU entry starts with."""
    key = reading.key
    return {
        "host": key.host,
        "gpu": key.gpu,
        "instance": key.instance,
        "profile": reading.profile,
        "uuid": reading.uuid,
        "model": reading.model,
        "util_pct": _number(reading.util_pct),
        "temp_c": _number(reading.temp_c),
        "last_xid": reading.last_xid,
        "xid_counts": {str(code): count for code, count in reading.xid_counts.items()},
        "clock_reasons": (
            decode_clock_reasons(reading.clock_reasons) if reading.clock_reasons is not None else []
        ),
        "row_remap_failure": reading.row_remap_failure,
        "health": HEALTH_NAMES.get(reading.health) if reading.health is not None else None,
        "pod": reading.pod,
        "namespace": reading.namespace,
        "container": reading.container,
    }


def _entry(
    reading: GpuReading, table: XidTable, thresholds: Thresholds, now: float
) -> dict[str, Any]:
    state = GpuState(reading.key)
    observe(state, reading, now, table, thresholds)
    verdict = assess(state, now, thresholds)
    if verdict.faulted and state.fault is not None:
        word, reasons = "faulted", list(state.fault.reasons)
    elif _judgeable(reading, thresholds):
        word, reasons = "ok", []
    else:
        word, reasons = "unknown", [NOTHING_TO_JUDGE]
    return {**reading_fields(reading), "verdict": word, "reasons": reasons + _notes(reading, table)}


def _judgeable(reading: GpuReading, thresholds: Thresholds) -> bool:
    """Whether the scrape holds any value a fault verdict reads."""
    return (
        reading.last_xid is not None
        or bool(reading.xid_counts)
        or reading.clock_reasons is not None
        or reading.row_remap_failure is not None
        or reading.health is not None
        or (reading.temp_c is not None and thresholds.max_temp_c is not None)
    )


def _notes(reading: GpuReading, table: XidTable) -> list[str]:
    """What an operator should see although it faults nothing: a non-fatal or unknown XID, WARN."""
    notes = []
    code = reading.last_xid
    if code and not table.is_fatal(code):
        notes.append(table.describe(code))
    if reading.health == HEALTH_WARN:
        notes.append(f"DCGM health WARN (watch {', '.join(reading.health_watches)})")
    return notes


def _number(value: float | None) -> float | int | None:
    """A whole number prints as one (``91``, as the exporter wrote it), not ``91.0``."""
    if value is not None and float(value).is_integer():
        return int(value)
    return value
