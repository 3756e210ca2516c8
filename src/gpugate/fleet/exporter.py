"""A fake NVIDIA dcgm-exporter: ``GET /metrics`` in the real exposition shape, steerable at runtime.

Control API (JSON): ``POST /_control/gpus/{index}`` with any `GpuReadings` field; ``POST /_control``
with `mode`; ``POST /_control/restart``; ``GET /_control`` (state); ``GET /_stats`` (scrapes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import Counter, deque
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Self, get_args

from aiohttp import web

from gpugate.fleet import exposition
from gpugate.fleet.control import Check, ControlError, one_of, patched
from gpugate.fleet.exposition import DEFAULT_COUNTERS, OPTIONAL_COUNTERS, GpuScrape, Host
from gpugate.fleet.gpu import GpuReadings
from gpugate.fleet.site import LocalSite, abort

if TYPE_CHECKING:
    import socket
    from collections.abc import Iterable

ExporterMode = Literal["normal", "down", "garbage", "truncated", "hang", "reset"]
"""How scrapes are answered.

`normal`; `down`: 503; `garbage`: 200 with an HTML page; `truncated`: 200 with the exposition cut
in the middle of a label set (complete HTTP, incomplete text); `hang`: no answer until the client
goes away or the mode changes; `reset`: headers and half the body, then a TCP reset.
"""
MODES: tuple[str, ...] = get_args(ExporterMode)
HostLabel = Literal["Hostname", "hostname"]

DEFAULT_MODEL_NAME = "NVIDIA H100 80GB HBM3"
DEFAULT_DRIVER = "580.105.08"
_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_GARBAGE = (
    b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n"
    b"<body><h1>502 Bad Gateway</h1><p>nginx</p></body></html>\n"
)


@dataclass(frozen=True, slots=True)
class _Settings:
    """The exporter-wide settings ``POST /_control`` changes."""

    mode: str = "normal"

    def patched(self, patch: object) -> _Settings:
        return patched(self, patch, _SETTINGS_CHECKS)


_SETTINGS_CHECKS: MappingProxyType[str, Check] = MappingProxyType({"mode": one_of(*MODES)})


class FakeExporter:
    """A dcgm-exporter for `gpus` simulated GPUs on host `hostname`.

    `counters` names the optional series to emit (see `exposition.OPTIONAL_COUNTERS`);
    `emit_xid` False leaves the XID series out, as most real exporters do. `set_gpu`,
    `set_mode` and `restart` are the in-process form of the control API.
    """

    def __init__(  # noqa: PLR0913 - each keyword is one independent knob of the exporter
        self,
        gpus: int = 2,
        *,
        hostname: str = "fleet-node",
        host_label: HostLabel = "Hostname",
        model_name: str = DEFAULT_MODEL_NAME,
        driver: str = DEFAULT_DRIVER,
        counters: Iterable[str] = DEFAULT_COUNTERS,
        emit_xid: bool = True,
        xid_window_s: float = 300.0,
    ) -> None:
        self.counters = frozenset(counters)
        unknown = sorted(self.counters - OPTIONAL_COUNTERS)
        if unknown:
            raise ValueError(f"unknown counters {unknown}; known: {sorted(OPTIONAL_COUNTERS)}")
        if host_label not in get_args(HostLabel):
            raise ValueError(f"host_label must be one of {get_args(HostLabel)}")
        self.hostname = hostname
        self.host_label = host_label
        self.model_name = model_name
        self.xid_window_s = xid_window_s
        host = Host(hostname, host_label, model_name, driver)
        self._labels = tuple(host.gpu_labels(index) for index in range(gpus))
        self._initial = GpuReadings(emit_xid=emit_xid)
        self._gpus = [self._initial] * gpus
        self._xid_events: list[deque[tuple[float, int]]] = [deque() for _ in range(gpus)]
        self._energy_mj = [1_000_000.0 * (index + 1) for index in range(gpus)]
        self._energy_at = time.monotonic()
        self._settings = _Settings()
        self._unhung = asyncio.Event()
        self._unhung.set()
        self.scrapes = 0
        self.restarts = 0
        self._site = LocalSite(self.make_app)

    def __repr__(self) -> str:
        where = self._site.url if self._site.running else "stopped"
        return (
            f"<FakeExporter {self.hostname} {where} gpus={len(self._gpus)} mode={self.mode}"
            f" scrapes={self.scrapes}>"
        )

    # -- in-process control ---------------------------------------------------------------

    @property
    def gpus(self) -> tuple[GpuReadings, ...]:
        return tuple(self._gpus)

    @property
    def mode(self) -> str:
        return self._settings.mode

    def set_gpu(self, index: int, **fields: Any) -> GpuReadings:
        """Change GPU `index` (IndexError if none); a non-zero `xid` is one more XID event."""
        return self._set_gpu(index, fields)

    def _set_gpu(self, index: int, patch: object) -> GpuReadings:
        if not 0 <= index < len(self._gpus):
            raise IndexError(f"no GPU {index}; this exporter has {len(self._gpus)}")
        readings = self._gpus[index].patched(patch)
        self._gpus[index] = readings
        if isinstance(patch, dict) and "xid" in patch and readings.xid:
            self._xid_events[index].append((time.monotonic(), readings.xid))
        return readings

    def set_mode(self, mode: str) -> None:
        """Answer scrapes in `mode` from now on (ControlError if unknown); see `ExporterMode`."""
        self._apply(self._settings.patched({"mode": mode}))

    def _apply(self, settings: _Settings) -> None:
        self._settings = settings
        if settings.mode == "hang":
            self._unhung.clear()
        else:
            self._unhung.set()

    def restart(self) -> None:
        """An exporter restart: every last-XID value back to 0, the XID windows emptied."""
        self.restarts += 1
        self._gpus = [dataclasses.replace(readings, xid=0) for readings in self._gpus]
        for events in self._xid_events:
            events.clear()

    def exposition(self) -> str:
        """The text a normal scrape returns now."""
        now = time.monotonic()
        elapsed, self._energy_at = now - self._energy_at, now
        scrapes = []
        for index, readings in enumerate(self._gpus):
            self._energy_mj[index] += readings.power_w * elapsed * 1000.0
            scrapes.append(
                GpuScrape(
                    labels=self._labels[index],
                    readings=readings,
                    energy_mj=int(self._energy_mj[index]),
                    xid_counts=self._xid_counts(index, now),
                )
            )
        return exposition.render(scrapes, self.counters, int(self.xid_window_s * 1000))

    def _xid_counts(self, index: int, now: float) -> tuple[tuple[int, int], ...]:
        events = self._xid_events[index]
        while events and events[0][0] < now - self.xid_window_s:
            events.popleft()
        return tuple(sorted(Counter(code for _, code in events).items()))

    def state(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "hostname": self.hostname,
            "host_label": self.host_label,
            "counters": sorted(self.counters),
            "restarts": self.restarts,
            "gpus": [{"index": i, **gpu.as_json()} for i, gpu in enumerate(self._gpus)],
        }

    # -- running ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The base URL; scrapes go to ``{url}/metrics``."""
        return self._site.url

    @property
    def metrics_url(self) -> str:
        return f"{self._site.url}/metrics"

    async def start(self, host: str = "127.0.0.1", port: int | socket.socket | None = None) -> str:
        return await self._site.start(host, port)

    async def stop(self) -> None:
        await self._site.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/_control", self._get_control)
        app.router.add_post("/_control", self._post_control)
        app.router.add_post("/_control/gpus/{index}", self._post_gpu)
        app.router.add_post("/_control/restart", self._post_restart)
        app.router.add_get("/_stats", self._get_stats)
        return app

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.scrapes += 1
        if self.mode == "hang":
            await self._unhung.wait()
        mode = self.mode
        if mode == "down":
            return web.Response(status=503, text="dcgm-exporter is down (fleet mode 'down')\n")
        if mode == "garbage":
            return web.Response(body=_GARBAGE, content_type="text/html")
        body = self.exposition().encode()
        if mode == "truncated":
            return web.Response(body=truncated(body), headers={"Content-Type": _CONTENT_TYPE})
        if mode == "reset":
            response = web.StreamResponse(headers={"Content-Type": _CONTENT_TYPE})
            response.content_length = len(body)
            await response.prepare(request)
            await response.write(body[: len(body) // 2])
            abort(request)
            return response
        return web.Response(body=body, headers={"Content-Type": _CONTENT_TYPE})

    async def _get_control(self, _: web.Request) -> web.Response:
        return web.json_response(self.state())

    async def _post_control(self, request: web.Request) -> web.Response:
        try:
            self._apply(self._settings.patched(await _json(request)))
        except ControlError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(self.state())

    async def _post_gpu(self, request: web.Request) -> web.Response:
        try:
            index = int(request.match_info["index"])
            readings = self._set_gpu(index, await _json(request))
        except (IndexError, ValueError) as exc:
            status = 404 if isinstance(exc, IndexError) else 400
            return web.json_response({"error": str(exc)}, status=status)
        return web.json_response({"index": index, **readings.as_json()})

    async def _post_restart(self, _: web.Request) -> web.Response:
        self.restart()
        return web.json_response(self.state())

    async def _get_stats(self, _: web.Request) -> web.Response:
        return web.json_response({"scrapes": self.scrapes, "restarts": self.restarts})


async def _json(request: web.Request) -> object:
    try:
        return json.loads(await request.read() or b"{}")
    except ValueError as exc:
        raise ControlError(f"the body is not valid JSON: {exc}") from exc


def truncated(body: bytes) -> bytes:
    """`body` cut inside the label set of a sample line past its middle (never parseable)."""
    brace = body.find(b"{", len(body) // 2)
    return body[: len(body) // 2] if brace < 0 else body[: brace + 5]
