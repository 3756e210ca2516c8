"""The GPU entries of ``gpugate gpus inspect --json`` and ``GET /admin/gpus`` (DESIGN §7).

One entry per GPU and per MIG instance, built by :func:`entry` for both: what the scrape says of
the GPU, the verdict and why. ``faulted`` while a fault holds; else ``unknown`` when the reading
holds none of the series a verdict reads, ``ok`` otherwise.

* :func:`inspect` judges one scrape as if it were the first sample this gateway saw of each GPU
  (so a fatal sticky XID counts, as "seen at start" does): ``faulted`` on a fatal XID, an HW
  thermal/slowdown clock event, ``temp ≥ max_temp_c``, a row-remap failure or DCGM health FAIL.
  Saturation needs several samples and is not judged here.
* :func:`live_entry` is the same entry for the newest reading of a GPU the monitor follows, with
  the fault the monitor holds (which outlives the evidence, and an operator's clear ends) and
  what only a running monitor knows: ``stale``, ``saturated``, ``fault_reason``,
  ``faulted_since``; their reasons follow inspect's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gpugate.core.gpu.dcgm import HEALTH_NAMES, HEALTH_WARN, GpuReading
from gpugate.core.gpu.health import GpuState, Thresholds, assess, decode_clock_reasons, observe
from gpugate.core.gpu.xid import XidTable

NOTHING_TO_JUDGE = "no XID, clock-event, temperature, row-remap or health series"


def inspect(
    readings: Iterable[GpuReading], table: XidTable, thresholds: Thresholds, now: float = 0.0
) -> list[dict[str, Any]]:
    """The ``gpus`` entries for one scrape's readings, in the readings' order."""
    return [
        entry(reading, table, thresholds, _first_sample_fault(reading, table, thresholds, now))
        for reading in readings
    ]


def entry(
    reading: GpuReading, table: XidTable, thresholds: Thresholds, fault: Sequence[str] | None
) -> dict[str, Any]:
    """One GPU's entry: ``reading``'s fields, the verdict and why.

    ``fault`` is the reasons of the fault held for the GPU, None when none holds. Notes that
    fault nothing (a non-fatal XID, DCGM health WARN) follow the reasons either way.
    """
    if fault is not None:
        word, reasons = "faulted", list(fault)
    elif _judgeable(reading, thresholds):
        word, reasons = "ok", []
    else:
        word, reasons = "unknown", [NOTHING_TO_JUDGE]
    return {**reading_fields(reading), "verdict": word, "reasons": reasons + _notes(reading, table)}


def live_entry(
    state: GpuState, now: float, table: XidTable, thresholds: Thresholds
) -> dict[str, Any] | None:
    """:func:`entry` for ``state``'s newest reading (None before its first), judged by what
    ``state`` holds at ``now``, plus ``stale``, ``saturated``, ``fault_reason`` and
    ``faulted_since`` (monotonic).

    A fault ``state`` holds is ``faulted`` even when ``reading`` alone would not be; one it no
    longer holds (cleared, or its hold ran out) is not, even when ``reading`` alone would be.
    """
    reading = state.latest
    if reading is None:
        return None
    verdict = assess(state, now, thresholds)
    found = entry(reading, table, thresholds, verdict.fault_reasons if verdict.faulted else None)
    found["reasons"] += [why for why in verdict.reasons if why not in verdict.fault_reasons]
    return {
        **found,
        "stale": verdict.stale,
        "saturated": verdict.saturated,
        "fault_reason": verdict.fault_reason,
        "faulted_since": verdict.faulted_since,
    }


def _first_sample_fault(
    reading: GpuReading, table: XidTable, thresholds: Thresholds, now: float
) -> tuple[str, ...] | None:
    """The reasons of the fault ``reading`` raises as the first sample of its GPU, or None."""
    state = GpuState(reading.key)
    observe(state, reading, now, table, thresholds)
    verdict = assess(state, now, thresholds)
    return verdict.fault_reasons if verdict.faulted else None


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
