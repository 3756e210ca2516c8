"""Small builders for the GPU-health tests: readings, thresholds, exporter text, fixtures."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Self

from aiohttp import web

from gpugate.adapters.exposition import parse
from gpugate.core.gpu.dcgm import GpuKey, GpuReading, readings
from gpugate.core.gpu.health import GpuState, Thresholds, observe
from gpugate.core.gpu.xid import XidTable
from gpugate.fleet.site import LocalSite

TABLE = XidTable.load()
POLL_S = 15.0

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
"""Real scrapes, byte for byte as published; provenance and licences in its SOURCES.md."""


def fixture_dir() -> Path:
    return FIXTURES


def fixture_bytes(name: str) -> bytes:
    return (fixture_dir() / name).read_bytes()


def fixture_readings(name: str, *, host: str | None = None) -> list[GpuReading]:
    return readings(parse(fixture_bytes(name)), host=host)


def thresholds(
    *,
    staleness_s: float = 60.0,
    sustained_samples: int = 4,
    shed_util_pct: float = 95.0,
    fault_hold_s: float = 300.0,
    max_temp_c: float | None = 90.0,
    couple_faults: bool = True,
) -> Thresholds:
    return Thresholds(
        staleness_s=staleness_s,
        sustained_samples=sustained_samples,
        shed_util_pct=shed_util_pct,
        fault_hold_s=fault_hold_s,
        max_temp_c=max_temp_c,
        couple_faults=couple_faults,
    )


def reading(
    gpu: int = 0,
    *,
    host: str | None = "node-a",
    instance: str | None = None,
    util: float | None = None,
    temp: float | None = None,
    xid: int | None = None,
    xid_counts: Mapping[int, int] | None = None,
    clock: int | None = None,
    row_remap: bool | None = None,
    health: int | None = None,
    watches: tuple[str, ...] = (),
) -> GpuReading:
    """One scrape's view of one GPU; every series absent unless given."""
    return GpuReading(
        key=GpuKey(host, gpu, instance),
        uuid=f"GPU-{gpu:08d}",
        model="NVIDIA H100 80GB HBM3",
        util_pct=util,
        temp_c=temp,
        last_xid=xid,
        xid_counts=MappingProxyType(dict(xid_counts or {})),
        clock_reasons=clock,
        row_remap_failure=row_remap,
        health=health,
        health_watches=watches,
    )


def fed(
    steps: Iterable[tuple[float, GpuReading]],
    limits: Thresholds | None = None,
    table: XidTable = TABLE,
) -> GpuState:
    """A state that has observed each (time, reading) in turn."""
    state: GpuState | None = None
    for now, one in steps:
        state = state or GpuState(one.key)
        observe(state, one, now, table, limits or thresholds())
    assert state is not None, "feed at least one reading"
    return state


def polls(
    utils: Iterable[float | None], *, start: float = 0.0, every: float = POLL_S
) -> list[tuple[float, GpuReading]]:
    """One reading per poll with these utils (None = the poll was missed: no reading at all)."""
    return [
        (start + i * every, reading(util=util)) for i, util in enumerate(utils) if util is not None
    ]


def dcgm_line(
    name: str,
    value: str | float,
    *,
    gpu: int = 0,
    host: str | None = "node-a",
    host_label: str = "Hostname",
    **extra: str,
) -> str:
    """One sample line with dcgm-exporter's label set (``extra`` labels appended)."""
    pairs = [
        ("gpu", str(gpu)),
        ("UUID", f"GPU-{gpu:08d}-0000-0000-0000-000000000000"),
        ("pci_bus_id", f"00000000:{0x18 + gpu:02X}:00.0"),
        ("device", f"nvidia{gpu}"),
        ("modelName", "NVIDIA H100 80GB HBM3"),
    ]
    if host is not None:
        pairs.append((host_label, host))
    pairs += [("DCGM_FI_DRIVER_VERSION", "580.105.08"), *extra.items()]
    labels = ",".join(f'{label}="{text}"' for label, text in pairs)
    return f"{name}{{{labels}}} {value}"


def scrape(*lines: str) -> list[GpuReading]:
    """The readings of an exposition made of these lines."""
    return readings(parse("\n".join(lines) + "\n"))


class ScrapeServer:
    """A dcgm-exporter stand-in on a loopback port: ``GET /metrics`` answers ``body`` with
    ``status``, both of which the test may change between polls — or, while ``script`` holds
    any, the next (status, body) of it, one per scrape. ``scrapes`` counts the GETs (a poll is
    over once the next one has started: a monitor polls one scrape at a time)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.status = 200
        self.script: list[tuple[int, bytes]] = []
        self.scrapes = 0
        self._site = LocalSite(self._app)

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _metrics(self, _: web.Request) -> web.Response:
        self.scrapes += 1
        status, body = self.script.pop(0) if self.script else (self.status, self.body)
        return web.Response(status=status, body=body, content_type="text/plain")

    @property
    def metrics_url(self) -> str:
        return self._site.url + "/metrics"

    async def __aenter__(self) -> Self:
        await self._site.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._site.stop()
