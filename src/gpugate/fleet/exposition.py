"""dcgm-exporter's text exposition, written by hand in the shape real exporters print.

One ``# HELP``/``# TYPE`` pair per family, then one sample per GPU with the label set
``gpu, UUID, pci_bus_id, device, modelName, Hostname|hostname, DCGM_FI_DRIVER_VERSION``;
integers print as integers, doubles with six decimals (Go's ``%f``), as the exporter does.
A family with no sample (e.g. XID when no GPU emits it) is left out entirely.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from gpugate.fleet.gpu import HEALTH_PASS, GpuReadings, xid_message

CLOCKS_EVENT_REASONS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
CLOCK_THROTTLE_REASONS = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
XID_ERRORS_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
GPU_HEALTH_STATUS = "DCGM_EXP_GPU_HEALTH_STATUS"

OPTIONAL_COUNTERS = frozenset(
    {CLOCKS_EVENT_REASONS, CLOCK_THROTTLE_REASONS, ROW_REMAP_FAILURE, XID_ERRORS_COUNT,
     GPU_HEALTH_STATUS}
)  # fmt: skip
"""Series emitted only when named in an exporter's `counters`."""
DEFAULT_COUNTERS = frozenset({CLOCKS_EVENT_REASONS, ROW_REMAP_FAILURE})


@dataclass(frozen=True, slots=True)
class GpuScrape:
    """One GPU as one scrape shows it."""

    labels: str
    readings: GpuReadings
    energy_mj: int
    xid_counts: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Host:
    """The machine an exporter runs on: what every per-GPU label set carries besides the GPU."""

    hostname: str
    host_label: str
    model_name: str
    driver: str

    def gpu_labels(self, index: int) -> str:
        """The label set dcgm-exporter puts on every sample of GPU `index`."""
        gpu_uuid = uuid.uuid5(uuid.NAMESPACE_DNS, f"{index}.{self.hostname}.fleet")
        pairs = (
            ("gpu", str(index)),
            ("UUID", f"GPU-{gpu_uuid}"),
            ("pci_bus_id", f"00000000:{0x18 + 0x10 * index:02X}:00.0"),
            ("device", f"nvidia{index}"),
            ("modelName", self.model_name),
            (self.host_label, self.hostname),
            ("DCGM_FI_DRIVER_VERSION", self.driver),
        )
        return ",".join(f'{name}="{_escape(value)}"' for name, value in pairs)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


Value = Callable[[GpuScrape], float]

_GAUGES: tuple[tuple[str, str, str, Value], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).",
     lambda g: 210 + 17 * g.readings.util),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
     lambda g: 2619 if g.readings.util else 405),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", lambda _: 0),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda g: g.readings.temp),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda g: g.readings.power_w),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Total energy consumption since boot (in mJ).", lambda g: g.energy_mj),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", lambda _: 0),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda g: g.readings.util),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).",
     lambda g: g.readings.util * 3 // 5),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", lambda _: 0),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", lambda _: 0),
)  # fmt: skip
_MEMORY: tuple[tuple[str, str, str, Value], ...] = (
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
     lambda g: max(0, g.readings.fb_total - g.readings.fb_used - 470)),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
     lambda g: g.readings.fb_used),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", lambda _: 470),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for uncorrectable errors", lambda _: 0),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for correctable errors", lambda _: 0),
)  # fmt: skip
_OPTIONAL: tuple[tuple[str, str, str, Value], ...] = (
    (ROW_REMAP_FAILURE, "gauge", "Whether remapping of rows has failed",
     lambda g: g.readings.row_remap_failure),
    (CLOCKS_EVENT_REASONS, "gauge", "Current clock event reasons (bitmask).",
     lambda g: g.readings.clock_event_reasons),
    (CLOCK_THROTTLE_REASONS, "gauge", "Current clock throttle reasons (bitmask).",
     lambda g: g.readings.clock_event_reasons),
)  # fmt: skip
_PROF = (
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
     lambda g: g.readings.util / 100.0),
)  # fmt: skip


def render(gpus: Sequence[GpuScrape], counters: frozenset[str], window_ms: int) -> str:
    """The whole ``/metrics`` body for these GPUs."""
    optional = tuple(family for family in _OPTIONAL if family[0] in counters)
    lines: list[str] = []
    for family in _GAUGES:
        lines += _simple(family, gpus)
    lines += _xid(gpus)
    for family in (*_MEMORY, *optional, *_PROF):
        lines += _simple(family, gpus)
    if XID_ERRORS_COUNT in counters:
        lines += _xid_count(gpus, window_ms)
    if GPU_HEALTH_STATUS in counters:
        lines += _health(gpus)
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:f}"


def _head(name: str, kind: str, text: str) -> tuple[str, str]:
    return f"# HELP {name} {text}", f"# TYPE {name} {kind}"


def _simple(family: tuple[str, str, str, Value], gpus: Sequence[GpuScrape]) -> Iterator[str]:
    name, kind, text, value = family
    if gpus:
        yield from _head(name, kind, text)
    for gpu in gpus:
        yield f"{name}{{{gpu.labels}}} {_number(value(gpu))}"


def _xid(gpus: Sequence[GpuScrape]) -> Iterator[str]:
    name = "DCGM_FI_DEV_XID_ERRORS"
    shown = [gpu for gpu in gpus if gpu.readings.emit_xid]
    if shown:
        yield from _head(name, "gauge", "Value of the last XID error encountered.")
    for gpu in shown:
        code = gpu.readings.xid
        extra = f'err_code="{code}",err_msg="{_escape(xid_message(code))}"'
        yield f"{name}{{{gpu.labels},{extra}}} {code}"


def _xid_count(gpus: Sequence[GpuScrape], window_ms: int) -> Iterator[str]:
    name = XID_ERRORS_COUNT
    text = "Count of XID Errors within user-specified time window (see xid-count-window-size flag)."
    if gpus:
        yield from _head(name, "gauge", text)
    window = f'window_size_in_ms="{window_ms}"'
    for gpu in gpus:
        if not gpu.xid_counts:  # the exporter's zero series, without an xid label
            yield f"{name}{{{gpu.labels},{window}}} 0"
        for code, count in gpu.xid_counts:
            yield f'{name}{{{gpu.labels},{window},xid="{code}"}} {count}'


def _health(gpus: Sequence[GpuScrape]) -> Iterator[str]:
    name = GPU_HEALTH_STATUS
    if gpus:
        yield from _head(name, "gauge", "GPU health status (0 pass, 10 warn, 20 fail).")
    for gpu in gpus:
        health = gpu.readings.health
        code = "DCGM_FR_OK" if health == HEALTH_PASS else "DCGM_FR_UNKNOWN"
        extra = f'health_watch="ALL",health_error_code="{code}"'
        yield f"{name}{{{gpu.labels},{extra}}} {health}"
