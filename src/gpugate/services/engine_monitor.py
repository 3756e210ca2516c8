"""The engine monitor: scrape each endpoint's model-server metrics, keep one reading per endpoint.

For every upstream with ``engine:`` (and ``kind`` other than ``none``), each endpoint's
``url + metrics_path`` is scraped every ``poll_s`` with a ``scrape_timeout_s`` limit, parsed by
the real exposition parser (:mod:`gpugate.adapters.exposition`) and read by
:func:`gpugate.core.engine_metrics.reading` (vLLM, SGLang or TEI names; ``auto`` detects which).
A failed scrape — down, hung, 5xx, garbage, no engine series — is counted and logged and keeps
the last reading; routing reads only a reading younger than ``staleness_s``
(:meth:`EngineMonitor.signal`), so stale data falls back to gpugate's own outstanding counts
(fail open). Nothing raises out of :meth:`EngineMonitor.tick`.

Each reading remembers the endpoint's outstanding count when it was taken, so between scrapes
the router adds what gpugate sent (or saw finish) since: ``load = running + waiting +
(outstanding now - outstanding then)``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from gpugate.adapters import exposition
from gpugate.adapters.upstream_client import UpstreamClient
from gpugate.clock import Clock
from gpugate.config import EngineConfig, UpstreamConfig
from gpugate.core import engine_metrics
from gpugate.core.engine_metrics import EngineReading, EngineSignal
from gpugate.errors import ScrapeError, UpstreamError
from gpugate.metrics import Metrics
from gpugate.services.gpu_monitor import fetch_scrape

log = logging.getLogger("gpugate.engine")

#: Gets a metrics body; raises ScrapeError or UpstreamError when it cannot.
Fetch = Callable[[str, float], Awaitable[bytes]]
#: gpugate's own outstanding count of an endpoint (upstream id, url) now.
Outstanding = Callable[[str, str], int]


@dataclass(slots=True, eq=False)
class EngineEndpoint:
    """One endpoint's scrapes: where, how, the last reading and how the scrapes went."""

    upstream_id: str
    url: str
    cfg: EngineConfig
    index: int = 0  # its place in the upstream's ``urls``: how open metrics name it
    reading: EngineReading | None = None
    read_at: float | None = None
    outstanding_then: int = 0
    due_at: float = 0.0
    scrapes: int = 0
    failures: int = 0
    last_error: str | None = None

    @property
    def metrics_url(self) -> str:
        return self.url + self.cfg.metrics_path

    @property
    def label(self) -> str:
        """The endpoint for a metric label: scheme, host and port (never any userinfo)."""
        parts = urlsplit(self.url)
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{parts.hostname}{port}{parts.path}"


class EngineMonitor:
    """Scrapes engines. :meth:`tick` scrapes the endpoints that are due; :meth:`run` loops."""

    def __init__(
        self,
        upstreams: Sequence[UpstreamConfig],
        client: UpstreamClient,
        clock: Clock,
        metrics: Metrics,
        *,
        outstanding: Outstanding | None = None,
        fetch: Fetch | None = None,
    ) -> None:
        self._client = client
        self._clock = clock
        self._metrics = metrics
        self._outstanding = outstanding or (lambda _upstream, _url: 0)
        self._fetch = fetch or self._fetch_over_http
        self.endpoints: dict[tuple[str, str], EngineEndpoint] = {}  # by (upstream id, url)
        self.reconfigure(upstreams)

    def reconfigure(self, upstreams: Sequence[UpstreamConfig]) -> None:
        """Which endpoints to scrape, and how (config reloads change it); readings of endpoints
        that stay are kept."""
        old = self.endpoints
        self.endpoints = {}
        for upstream in upstreams:
            cfg = upstream.engine
            if cfg is None or cfg.kind == "none":
                continue
            for index, url in enumerate(upstream.endpoints):
                key = (upstream.id, url)
                kept = old.get(key)
                self.endpoints[key] = (
                    kept
                    if kept is not None and kept.cfg == cfg and kept.index == index
                    else EngineEndpoint(upstream.id, url, cfg, index)
                )

    @property
    def active(self) -> bool:
        """Whether any endpoint is scraped at all."""
        return bool(self.endpoints)

    def bind_outstanding(self, outstanding: Outstanding) -> None:
        self._outstanding = outstanding

    def signal(self, upstream_id: str, url: str, now: float) -> EngineSignal | None:
        """The fresh reading of an upstream's endpoint at ``url``, or None (never scraped, or
        stale)."""
        endpoint = self.endpoints.get((upstream_id, url))
        if endpoint is None or endpoint.reading is None or endpoint.read_at is None:
            return None
        age = now - endpoint.read_at
        if age > endpoint.cfg.staleness_s:
            return None
        return EngineSignal(endpoint.reading, endpoint.outstanding_then, age)

    async def tick(self) -> int:
        """Scrape every endpoint whose poll is due; returns how many scrapes succeeded."""
        now = self._clock.monotonic()
        due = [e for e in self.endpoints.values() if e.due_at <= now]
        for endpoint in due:
            endpoint.due_at = now + endpoint.cfg.poll_s
        results = await asyncio.gather(*(self._scrape(e) for e in due))
        return sum(results)

    async def run(self) -> None:
        while True:
            await self.tick()
            await self._clock.sleep(self._next_wait())

    def _next_wait(self) -> float:
        now = self._clock.monotonic()
        polls = [e.due_at - now for e in self.endpoints.values()]
        return max(0.05, min(polls, default=1.0))

    async def _scrape(self, endpoint: EngineEndpoint) -> bool:
        endpoint.scrapes += 1
        cfg = endpoint.cfg
        try:
            body = await self._fetch(endpoint.metrics_url, cfg.scrape_timeout_s)
            samples = exposition.parse(body, engine_metrics.NAMES)
            kind = endpoint.reading.kind if endpoint.reading is not None else None
            if cfg.kind in ("vllm", "sglang", "tei"):
                kind = cfg.kind
            reading = engine_metrics.reading(samples, kind, endpoint.reading)
        except (ScrapeError, UpstreamError) as exc:
            endpoint.failures += 1
            endpoint.last_error = f"{exc.code}: {exc.message}"
            self._metrics.engine_scrapes.labels(endpoint.upstream_id, "error").inc()
            where = endpoint.label + endpoint.cfg.metrics_path  # never an URL's userinfo
            log.warning("engine scrape of %s failed: %s", where, exc.message)
            return False
        endpoint.reading = reading
        endpoint.read_at = self._clock.monotonic()
        endpoint.outstanding_then = self._outstanding(endpoint.upstream_id, endpoint.url)
        endpoint.last_error = None
        self._metrics.engine_scrapes.labels(endpoint.upstream_id, "ok").inc()
        self._export(endpoint, reading)
        return True

    def _export(self, endpoint: EngineEndpoint, reading: EngineReading) -> None:
        gauge = self._metrics.engine_load
        for signal, value in (
            ("running", reading.running),
            ("waiting", reading.waiting),
            ("kv_usage", reading.kv_usage),
            ("prefix_hit_rate", reading.prefix_hit_rate),
        ):
            if value is not None:
                # the endpoint's index, never its URL, on the open /metrics (issue #15 finding 8)
                gauge.labels(endpoint.upstream_id, str(endpoint.index), signal).set(value)

    async def _fetch_over_http(self, url: str, timeout_s: float) -> bytes:
        return await fetch_scrape(self._client, url, timeout_s)

    def __repr__(self) -> str:
        now = self._clock.monotonic()
        fresh = sum(1 for key in self.endpoints if self.signal(*key, now) is not None)
        failing = sum(1 for e in self.endpoints.values() if e.last_error)
        return f"<EngineMonitor endpoints={len(self.endpoints)} fresh={fresh} failing={failing}>"
