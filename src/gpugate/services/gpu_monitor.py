"""The GPU monitor: scrape every dcgm-exporter, keep each GPU's state, publish the verdicts.

Each tick scrapes every exporter concurrently (bounded by ``scrape_timeout_s``), folds the
successful scrapes into :class:`~gpugate.core.gpu.health.GpuFleetState`, then recomputes, once,
what routing reads on every request: which upstreams are out of rotation (and why) and which are
saturated. A failed scrape — down, hung, 5xx, garbage, no GPU series — is counted and logged and
changes no verdict; after ``staleness_s`` without a good scrape its GPUs are stale and nothing
new acts on them (fail open) — but a fault still inside its hold keeps its upstreams out of
rotation (old evidence is not no evidence; :func:`~gpugate.core.gpu.health.assess`). Nothing
raises out of :meth:`GpuMonitor.tick`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpugate.adapters import exposition
from gpugate.adapters.upstream_client import UpstreamClient
from gpugate.clock import Clock
from gpugate.config import GpuHealthConfig, UpstreamConfig
from gpugate.core.gpu import dcgm, report
from gpugate.core.gpu.health import GpuFleetState, Thresholds, parse_gpu_id
from gpugate.core.gpu.xid import XidTable
from gpugate.errors import ScrapeError, StoreError, UnknownGpu, UpstreamError
from gpugate.metrics import Metrics
from gpugate.store import AuditRecord

if TYPE_CHECKING:
    from prometheus_client import Gauge

log = logging.getLogger("gpugate.gpu")

#: Gets an exporter's body; raises ScrapeError or UpstreamError when it cannot.
Fetch = Callable[[str], Awaitable[bytes]]
#: The operators' clears any process stored at or after a time (the audit events CLEARED).
Clears = Callable[[datetime], Awaitable[Sequence[AuditRecord]]]
CLEARED = "gpu.cleared"
"""The audit action of an operator's clear: subject ``gpu:<id>``."""


@dataclass(slots=True)
class Exporter:
    """One dcgm-exporter and how its scrapes went."""

    url: str
    host: str | None  # the operator's name for it (``exporters[].host``); None with ``dcgm_url``
    last_success: float | None = None
    last_error: str | None = None
    failures: int = 0
    scrapes: int = 0

    @property
    def label(self) -> str:
        return self.host or self.url


@dataclass(frozen=True, slots=True)
class Published:
    """What routing reads on every request, recomputed once per tick (or clear)."""

    out_of_rotation: dict[str, str] = field(default_factory=dict)  # upstream id -> why
    #: upstream ids whose every GPU is saturated -> until when (monotonic): its data goes stale
    saturated: dict[str, float] = field(default_factory=dict)


async def fetch_scrape(client: UpstreamClient, url: str, timeout_s: float) -> bytes:
    """An exporter's body; a status other than 200 is a :class:`ScrapeError`."""
    status, body = await client.get(url, timeout_s)
    if status != 200:
        raise ScrapeError(f"{url} answered {status}")
    return body


def thresholds_of(cfg: GpuHealthConfig) -> Thresholds:
    return Thresholds(
        staleness_s=cfg.staleness_s,
        sustained_samples=cfg.sustained_samples,
        shed_util_pct=cfg.shed_util_pct,
        fault_hold_s=cfg.fault_hold_s,
        max_temp_c=cfg.max_temp_c,
        couple_faults=cfg.couple_faults,
    )


def _set_or_remove(gauge: Gauge, labels: tuple[str, str, str], value: float | None) -> None:
    if value is None:
        gauge.remove(*labels)
    else:
        gauge.labels(*labels).set(value)


class GpuMonitor:
    """Scrapes, judges, publishes. :meth:`tick` is one poll; :meth:`run` polls every ``poll_s``."""

    def __init__(
        self,
        cfg: GpuHealthConfig,
        upstreams: Sequence[UpstreamConfig],
        client: UpstreamClient,
        clock: Clock,
        metrics: Metrics,
        *,
        fetch: Fetch | None = None,
        clears: Clears | None = None,
    ) -> None:
        self.cfg = cfg
        self.table = XidTable.load(cfg.xid_overrides)
        self.fleet = GpuFleetState(self.table, thresholds_of(cfg))
        self.exporters = (
            [Exporter(cfg.dcgm_url, None)]
            if cfg.dcgm_url
            else [Exporter(e.url, e.host) for e in cfg.exporters]
        )
        self._client = client
        self._fetch = fetch or self._fetch_over_http
        self._clock = clock
        self._metrics = metrics
        self.published = Published()
        self._exported: set[tuple[str, str, str]] = set()  # the rows with gauge samples
        self._clears = clears
        self._clears_since = clock.now()  # the clears stored before this process are old news
        self._clears_seen: set[int] = set()  # ids of the clears at _clears_since, applied
        self.reconfigure(upstreams)

    def reconfigure(self, upstreams: Sequence[UpstreamConfig]) -> None:
        """Which GPUs each upstream runs on (config reloads change it)."""
        self._gpu_ids = {u.id: tuple(u.gpu_ids) for u in upstreams if u.gpu_ids}
        self._publish()

    async def tick(self) -> int:
        """Scrape every exporter once; returns how many scrapes succeeded."""
        results = await asyncio.gather(*(self._scrape(e) for e in self.exporters))
        await self._follow_clears()
        self._publish()
        return sum(results)

    async def run(self) -> None:
        while True:
            await self.tick()
            await self._clock.sleep(self.cfg.poll_s)

    def guard(self, upstream_id: str) -> str | None:
        """Why ``upstream_id`` is out of rotation (a faulted GPU), or None. A dict lookup."""
        return self.published.out_of_rotation.get(upstream_id)

    def saturated(self, upstream_id: str) -> bool:
        """Whether every GPU behind ``upstream_id`` is saturated. A dict lookup, and the moment
        its data goes stale: nothing is shed on stale data, not until the next poll either."""
        until = self.published.saturated.get(upstream_id)
        return until is not None and self._clock.monotonic() <= until

    def clear(self, gpu_id: int | str) -> list[str]:
        """An operator clears a GPU's held fault; it takes effect at once. Returns the rows;
        :class:`UnknownGpu` when no exporter has shown that GPU (a typo must not look cleared)."""
        if not self.fleet.keys_for(gpu_id):
            shown = sorted(
                {f"{k.host}/{k.gpu}" if k.host else str(k.gpu) for k in self.fleet.states}
            )
            raise UnknownGpu(
                f"no exporter has shown GPU {gpu_id} (shown: {', '.join(shown) or 'none'})"
            )
        cleared = self.fleet.clear(gpu_id, self._clock.monotonic())
        self._publish()
        return [str(key) for key in cleared]

    async def _follow_clears(self) -> None:
        """Apply the clears other processes took (``serve --workers N``, replicas on one store):
        an operator's ``POST /admin/gpus/{gpu}/clear`` reaches one process, and every other one
        finds its audit event here, within a poll. A fault that began after the clear was issued
        is not the one cleared (:meth:`GpuFleetState.clear`); this process's own clears come back
        too and change nothing more."""
        if self._clears is None:
            return
        try:
            events = await self._clears(self._clears_since)
        except StoreError as exc:
            log.warning("GPU clears of other processes not read: %s", exc.message)
            return
        wall, mono = self._clock.now(), self._clock.monotonic()
        fresh = sorted((e for e in events if e.id not in self._clears_seen), key=lambda e: e.id)
        for event in fresh:
            try:
                gpu_id = parse_gpu_id(event.subject.removeprefix("gpu:"))
            except ValueError:
                continue
            issued = mono - max(0.0, (wall - event.at).total_seconds())
            self.fleet.clear(gpu_id, mono, issued_at=issued)
        if events:
            self._clears_since = max(self._clears_since, *(e.at for e in events))
        self._clears_seen = {e.id for e in events if e.at >= self._clears_since}

    async def _scrape(self, exporter: Exporter) -> bool:
        started = self._clock.monotonic()
        exporter.scrapes += 1
        try:
            body = await self._fetch(exporter.url)
            found = dcgm.require_gpus(dcgm.readings(exposition.parse(body), host=exporter.host))
        except (ScrapeError, UpstreamError) as exc:
            exporter.failures += 1
            exporter.last_error = f"{exc.code}: {exc.message}"
            self._metrics.gpu_scrapes.labels(exporter.label, "error").inc()
            log.warning("scrape of %s failed: %s", exporter.url, exc.message)
            return False
        now = self._clock.monotonic()
        self.fleet.observe_scrape(found, now, exporter.host)
        exporter.last_success, exporter.last_error = now, None
        self._metrics.gpu_scrapes.labels(exporter.label, "ok").inc()
        self._metrics.gpu_scrape_duration.labels(exporter.label).observe(now - started)
        return True

    async def _fetch_over_http(self, url: str) -> bytes:
        return await fetch_scrape(self._client, url, self.cfg.scrape_timeout_s)

    def _publish(self) -> None:
        now = self._clock.monotonic()
        out: dict[str, str] = {}
        saturated: dict[str, float] = {}
        for upstream_id, gpu_ids in self._gpu_ids.items():
            verdicts = [(gpu_id, self.fleet.verdicts_for(gpu_id, now)) for gpu_id in gpu_ids]
            faulted = [f"GPU {gid} faulted: {v.fault_reason}" for gid, v in verdicts if v.faulted]
            if faulted and self.cfg.couple_faults:
                out[upstream_id] = "; ".join(faulted)
            until = self.fleet.saturated_until(gpu_ids, now)
            if until is not None:
                saturated[upstream_id] = until
        if out != self.published.out_of_rotation:
            log.warning("GPU guard: out of rotation now %s", out or "nothing")
        self.published = Published(out, saturated)
        self._export_gauges(now)

    def _export_gauges(self, now: float) -> None:
        """One sample per row and family; a value the newest scrape does not have (the series
        absent: unknown, never 0) has no sample, and a row the monitor forgot has none at all."""
        m = self._metrics
        shown = set()
        for key, state in self.fleet.states.items():
            labels = (key.host or "", str(key.gpu), key.instance or "")
            shown.add(labels)
            verdict = self.fleet.verdict(key, now)
            reading = state.latest
            _set_or_remove(m.gpu_util, labels, reading.util_pct if reading is not None else None)
            _set_or_remove(m.gpu_temp, labels, state.temp_c)
            _set_or_remove(m.gpu_last_xid, labels, state.last_xid)
            m.gpu_faulted.labels(*labels).set(int(verdict.faulted))
            m.gpu_saturated.labels(*labels).set(int(verdict.saturated))
            m.gpu_stale.labels(*labels).set(int(verdict.stale))
        families = (m.gpu_util, m.gpu_temp, m.gpu_last_xid, m.gpu_faulted, m.gpu_saturated)
        for labels in self._exported - shown:
            for gauge in (*families, m.gpu_stale):
                gauge.remove(*labels)
        self._exported = shown

    def snapshot(self, wall_now: datetime) -> list[dict[str, Any]]:
        """Every GPU row for ``GET /admin/gpus``: ``gpus inspect``'s entry for its newest reading
        judged by the fault the monitor holds (:func:`~gpugate.core.gpu.report.live_entry`),
        its upstreams, and ``faulted_since`` on the wall clock."""
        now = self._clock.monotonic()
        entries = []
        for key in sorted(self.fleet.states, key=lambda k: k.sort_key):
            state = self.fleet.states[key]
            found = report.live_entry(state, now, self.table, self.fleet.thresholds)
            if found is None:  # a row starts with a reading; none is without one
                continue
            since = found["faulted_since"]
            if since is not None:
                found["faulted_since"] = (wall_now - timedelta(seconds=now - since)).isoformat()
            entries.append({**found, "upstreams": self._upstreams_of(key)})
        return entries

    def _upstreams_of(self, key: dcgm.GpuKey) -> list[str]:
        return sorted(
            upstream_id
            for upstream_id, gpu_ids in self._gpu_ids.items()
            if key in {k for gid in gpu_ids for k in self.fleet.keys_for(gid)}
        )

    def __repr__(self) -> str:
        failing = sum(1 for e in self.exporters if e.last_error)
        return (
            f"<GpuMonitor exporters={len(self.exporters)} failing={failing} "
            f"out_of_rotation={len(self.published.out_of_rotation)} "
            f"saturated={len(self.published.saturated)}>"
        )
