"""What one simulated GPU reads, and the XID messages dcgm-exporter prints for it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType

from gpugate.fleet.control import Check, boolean, integer, number, one_of, patched

# Texts as in dcgm-exporter's internal/pkg/collector/xid_errors.go (a subset); any other code
# is rendered as UNKNOWN_XID, like the exporter does for codes outside its table.
XID_MESSAGES: MappingProxyType[int, str] = MappingProxyType(
    {
        0: "No Error",
        8: "GPU stopped processing",
        13: "Graphics Engine Exception",
        31: "GPU memory page fault",
        43: "GPU stopped processing",
        45: "Preemptive cleanup, due to previous errors -- Most likely to see when running"
        " multiple cuda",
        48: "Double Bit ECC Error",
        61: "Internal micro-controller breakpoint/warning",
        62: "Internal micro-controller halt",
        63: "ECC page retirement or row remapping recording event",
        64: "ECC page retirement or row remapper recording failure",
        74: "NVLINK Error",
        79: "GPU has fallen off the bus",
        92: "High single-bit ECC error rate",
        94: "Contained ECC error",
        95: "Uncontained ECC error",
        109: "Context Switch Timeout Error",
        119: "GSP RPC Timeout",
        120: "GSP Error",
        140: "Unrecovered ECC Error",
        154: "GPU Recovery Action Changed",
    }
)
UNKNOWN_XID = "Unknown Error"

GPU_IDLE = 0x1
HEALTH_PASS, HEALTH_WARN, HEALTH_FAIL = 0, 10, 20


def xid_message(code: int) -> str:
    return XID_MESSAGES.get(code, UNKNOWN_XID)


@dataclass(frozen=True, slots=True)
class GpuReadings:
    """The values one GPU shows in a scrape; what ``POST /_control/gpus/{index}`` changes.

    - `util` (%), `temp` (C), `fb_used` (MiB of `fb_total`);
    - `power` (W); None = derived from `util`;
    - `xid`: the sticky last XID (0 = none); `emit_xid`: whether the XID series exists at all;
    - `clock_reasons`: the clock-event bitmask; None = GPU_IDLE (0x1) when `util` is 0, else 0;
    - `row_remap_failure` (0/1), `health` (0 pass, 10 warn, 20 fail).
    """

    util: int = 0
    temp: int = 34
    fb_used: int = 0
    fb_total: int = 81559
    power: float | None = None
    xid: int = 0
    emit_xid: bool = True
    clock_reasons: int | None = None
    row_remap_failure: int = 0
    health: int = HEALTH_PASS

    def patched(self, patch: object) -> GpuReadings:
        """These readings with the fields of a JSON control body replaced (ControlError if bad)."""
        return patched(self, patch, _CHECKS)

    def as_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @property
    def power_w(self) -> float:
        return self.power if self.power is not None else 62.0 + 6.3 * self.util

    @property
    def clock_event_reasons(self) -> int:
        if self.clock_reasons is not None:
            return self.clock_reasons
        return GPU_IDLE if self.util == 0 else 0


_MIB_MAX = 1 << 24
_CHECKS: MappingProxyType[str, Check] = MappingProxyType(
    {
        "util": integer(0, 100),
        "temp": integer(-40, 200),
        "fb_used": integer(0, _MIB_MAX),
        "fb_total": integer(1, _MIB_MAX),
        "power": number(0.0, 10_000.0),
        "xid": integer(0, 1 << 31),
        "emit_xid": boolean(),
        "clock_reasons": integer(0, (1 << 63) - 1, optional=True),
        "row_remap_failure": one_of(0, 1),
        "health": one_of(HEALTH_PASS, HEALTH_WARN, HEALTH_FAIL),
    }
)
