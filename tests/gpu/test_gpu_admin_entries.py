"""``GET /admin/gpus`` gives each GPU the entry ``gpugate gpus inspect --json`` does (DESIGN §7).

Through a real gateway whose ``gpu_health.dcgm_url`` is a loopback server answering one scrape,
and the real CLI reading the same URL. The admin entry adds what only a running monitor knows
(``upstreams``, ``stale``, ``saturated``, ``fault_reason``, ``faulted_since``), and a fault the
monitor holds wins over what the latest sample alone would say.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from gpu_factories import ScrapeServer, dcgm_line, fixture_dir

from gpugate.cli import main
from gpugate.clock import ManualClock
from gpugate.core.gpu.report import NOTHING_TO_JUDGE
from harness import RunningGateway, eventually, make_config, serving, upstream

TOKEN = "admin-token"
POLL_S = 15.0
LIVE = {"upstreams", "stale", "saturated", "fault_reason", "faulted_since"}
"""What an admin entry adds to inspect's: the monitor's state, which one scrape cannot show."""

XID_79 = "XID 79 (GPU_HAS_FALLEN_OFF_THE_BUS): fatal"
XID_13 = "XID 13 (GR_EXCEPTION): not fatal"
INT64_BLANK = "9223372036854775792"
FP64_BLANK = "140737488355328"


def text(*lines: str) -> bytes:
    return ("\n".join(lines) + "\n").encode()


SCRAPES = {
    **{path.name: path.read_bytes() for path in sorted(fixture_dir().glob("dcgm-exporter-*"))},
    "xid-13-not-fatal": text(dcgm_line("DCGM_FI_DEV_XID_ERRORS", 13)),
    "xid-79-and-hot": text(
        dcgm_line("DCGM_FI_DEV_XID_ERRORS", 79), dcgm_line("DCGM_FI_DEV_GPU_TEMP", 93)
    ),
    "only-util": text(dcgm_line("DCGM_FI_DEV_GPU_UTIL", 40)),
    "blank-sentinels": text(
        dcgm_line("DCGM_FI_DEV_GPU_UTIL", INT64_BLANK),
        dcgm_line("DCGM_FI_DEV_GPU_TEMP", FP64_BLANK),
        dcgm_line("DCGM_FI_DEV_XID_ERRORS", INT64_BLANK),
        dcgm_line("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", INT64_BLANK),
    ),
}
"""Every real dcgm-exporter scrape in tests/fixtures/metrics, and a few written for a case."""


@dataclass
class Rig:
    gw: RunningGateway
    exporter: ScrapeServer
    clock: ManualClock

    async def poll(self, after_s: float = POLL_S) -> None:
        monitor = self.gw.gateway.monitor
        assert monitor is not None
        self.clock.advance(after_s)
        await monitor.tick()

    async def admin(self, method: str, path: str) -> Any:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            aiohttp.ClientSession() as http,
            http.request(method, self.gw.url + path, headers=auth) as resp,
        ):
            assert 200 == resp.status, await resp.text()
            return await resp.json()

    async def admin_gpus(self) -> dict[tuple[str | None, int, str | None], dict[str, Any]]:
        body = await self.admin("GET", "/admin/gpus")
        return {row_key(entry): entry for entry in body["gpus"]}

    async def inspected(
        self, capsys: pytest.CaptureFixture[str]
    ) -> dict[tuple[str | None, int, str | None], dict[str, Any]]:
        """What ``gpugate gpus inspect URL --json`` prints for the exporter's scrape now."""
        capsys.readouterr()
        await asyncio.to_thread(main, ["gpus", "inspect", self.exporter.metrics_url, "--json"])
        out = json.loads(capsys.readouterr().out)
        return {row_key(entry): entry for entry in out["gpus"]}


def row_key(entry: dict[str, Any]) -> tuple[str | None, int, str | None]:
    return entry["host"], entry["gpu"], entry["instance"]


def without_live(entry: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in entry.items() if key not in LIVE}


def as_written(*entries: dict[str, Any]) -> list[str]:
    """The entries as JSON text, where ``55`` and ``55.0`` differ (in Python they are equal)."""
    return [json.dumps(entry, sort_keys=True) for entry in entries]


@contextlib.asynccontextmanager
async def rig(sqlite_dsn: str, body: bytes) -> AsyncIterator[Rig]:
    """A gateway reading one exporter that answers ``body``; GPU 0 runs upstream ``u0``. The
    monitor polls once at start (awaited here), then only when the test says."""
    async with ScrapeServer(body) as exporter:
        health = {"dcgm_url": exporter.metrics_url, "poll_s": 3600}
        ups = [upstream("u0", ["http://127.0.0.1:9"], ["m"], gpu_ids=[0])]
        config = make_config(sqlite_dsn, ups, gpu_health=health)
        clock = ManualClock()
        environ = {"GPUGATE_ADMIN_TOKEN": TOKEN}
        async with serving(config, environ=environ, clock=clock) as gw:
            monitor = gw.gateway.monitor
            assert monitor is not None
            await eventually(
                lambda: all(e.last_success is not None or e.failures for e in monitor.exporters),
                what="the start-up poll",
            )
            yield Rig(gw, exporter, clock)


@pytest.mark.parametrize("name", sorted(SCRAPES))
async def test_admin_gpus_gives_each_gpu_every_key_and_value_gpus_inspect_gives_it(
    sqlite_dsn: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with rig(sqlite_dsn, SCRAPES[name]) as r:
        listed = await r.admin_gpus()
        inspected = await r.inspected(capsys)

    assert inspected, "a scrape without GPUs pins nothing"
    assert inspected == {key: without_live(entry) for key, entry in listed.items()}
    keys = sorted(inspected, key=str)
    assert as_written(*(inspected[key] for key in keys)) == as_written(
        *(without_live(listed[key]) for key in keys)
    )
    assert all(LIVE <= set(entry) for entry in listed.values())


async def test_a_held_fault_is_faulted_in_admin_gpus_while_the_latest_sample_alone_is_ok(
    sqlite_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The XID changes from 79 to 13: the sample alone is ok (13 is not fatal), the fault holds
    ``fault_hold_s``, also while the exporter is down, until an operator clears it."""
    fatal = text(dcgm_line("DCGM_FI_DEV_XID_ERRORS", 79), dcgm_line("DCGM_FI_DEV_GPU_TEMP", 55))
    async with rig(sqlite_dsn, fatal) as r:
        r.exporter.body = text(
            dcgm_line("DCGM_FI_DEV_XID_ERRORS", 13), dcgm_line("DCGM_FI_DEV_GPU_TEMP", 50)
        )
        await r.poll()
        ((key, alone),) = (await r.inspected(capsys)).items()
        held = (await r.admin_gpus())[key]
        r.exporter.status = 503
        await r.poll(after_s=120.0)  # stale (staleness_s 60), still inside the hold (300 s)
        stale = (await r.admin_gpus())[key]
        r.exporter.status = 200
        await r.poll()
        await r.admin("POST", "/admin/gpus/0/clear")
        cleared = (await r.admin_gpus())[key]

    assert ("ok", [XID_13]) == (alone["verdict"], alone["reasons"])
    faulted = {**alone, "verdict": "faulted", "reasons": [XID_79, XID_13]}
    assert faulted == without_live(held)
    assert as_written(faulted) == as_written(without_live(held))
    assert (XID_79, False) == (held["fault_reason"], held["stale"])
    assert ("faulted", True, XID_79) == (stale["verdict"], stale["stale"], stale["fault_reason"])
    assert XID_79 in stale["reasons"]
    assert as_written(alone) == as_written(without_live(cleared))
    assert (None, None) == (cleared["fault_reason"], cleared["faulted_since"])


@pytest.mark.parametrize(
    ("name", "gpu"),
    [
        ("only-util", ("node-a", 0, None)),
        ("blank-sentinels", ("node-a", 0, None)),
        ("dcgm-exporter-datadog-t4-stitched-throttle-unlabeled.prom", ("ip-11111", 0, None)),
    ],
)
async def test_a_gpu_without_any_series_a_verdict_reads_is_unknown_in_admin_gpus(
    sqlite_dsn: str, name: str, gpu: tuple[str | None, int, str | None]
) -> None:
    async with rig(sqlite_dsn, SCRAPES[name]) as r:
        entry = (await r.admin_gpus())[gpu]

    assert ("unknown", [NOTHING_TO_JUDGE]) == (entry["verdict"], entry["reasons"])
    assert (False, False, None) == (entry["stale"], entry["saturated"], entry["fault_reason"])
