"""``gpu_health``: where the DCGM exporters are and how their samples become verdicts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from gpugate.config.fields import (
    ConfigModel,
    ExporterHost,
    HttpUrl,
    HttpUrlOrEmpty,
    PositiveSeconds,
    Seconds,
)

XidSeverity = Literal["fatal", "nonfatal"]
# JSON (an imported or stored document) can only spell the XID codes as strings: accept "79".
XidCode = Annotated[int, Field(strict=False, ge=0)]


class ExporterConfig(ConfigModel):
    """One dcgm-exporter of a many-host fleet; its GPUs are named ``"<host>/<index>"``."""

    host: ExporterHost
    url: HttpUrl


class GpuHealthConfig(ConfigModel):
    """The GPU health monitor; with neither ``dcgm_url`` nor ``exporters`` it is dormant.

    Giving both is an error (checked with the cross-field rules, see :mod:`.rules`).
    """

    dcgm_url: HttpUrlOrEmpty = ""
    exporters: list[ExporterConfig] = Field(default_factory=list)
    poll_s: PositiveSeconds = 15.0
    staleness_s: PositiveSeconds = 60.0
    sustained_samples: int = Field(4, ge=1)
    shed_util_pct: float = Field(95.0, ge=0, le=100)
    couple_faults: bool = True
    shed_batch: bool = False
    fault_hold_s: Seconds = 300.0
    max_temp_c: float | None = 90.0
    scrape_timeout_s: PositiveSeconds = 5.0
    xid_overrides: dict[XidCode, XidSeverity] = Field(default_factory=dict)

    @property
    def dormant(self) -> bool:
        """No exporter to scrape: the monitor does nothing and routing ignores GPU health."""
        return not self.dcgm_url and not self.exporters

    def sources(self) -> tuple[ExporterConfig, ...]:
        """Every exporter to scrape; a lone ``dcgm_url`` is one exporter with host ``""``."""
        if self.dcgm_url:
            return (ExporterConfig(host="", url=self.dcgm_url),)
        return tuple(self.exporters)
