"""``gpugate gpus inspect SOURCE``: one dcgm-exporter scrape, from a file or a URL, judged.

The operator's tool for "what does the gateway see on this GPU, and why": each GPU and MIG
instance with its values, decoded clock-event reasons, verdict and reasons (DESIGN §7).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gpugate.adapters import exposition
from gpugate.adapters.upstream_client import UpstreamClient
from gpugate.config import GpuHealthConfig
from gpugate.core.gpu import dcgm, report
from gpugate.core.gpu.xid import XidTable
from gpugate.errors import ScrapeError, UpstreamError
from gpugate.services.gpu_monitor import fetch_scrape, thresholds_of


async def read_source(source: str, *, timeout_s: float = 10.0) -> bytes:
    """The scrape's bytes: fetched when ``source`` is an http(s) URL, else read from the file."""
    if source.startswith(("http://", "https://")):
        client = UpstreamClient()
        await client.start()
        try:
            return await fetch_scrape(client, source, timeout_s)
        finally:
            await client.close()
    try:
        return await asyncio.to_thread(Path(source).read_bytes)
    except OSError as exc:
        raise ScrapeError(f"cannot read {source}: {exc.strerror or exc}") from exc


async def inspect_source(
    source: str, cfg: GpuHealthConfig | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """(the GPU entries, the errors) for one scrape; never raises for a bad scrape."""
    cfg = cfg or GpuHealthConfig()
    try:
        body = await read_source(source, timeout_s=cfg.scrape_timeout_s)
        found = dcgm.readings(exposition.parse(body))
    except (ScrapeError, UpstreamError) as exc:
        return [], [f"{exc.code}: {exc.message}"]
    errors = [] if found else ["no DCGM GPU series in the scrape"]
    table = XidTable.load(cfg.xid_overrides)
    return report.inspect(found, table, thresholds_of(cfg)), errors


def render_table(entries: list[dict[str, Any]]) -> list[str]:
    """A terminal table: one line per GPU row, its reasons indented below."""
    names = [
        "/".join(str(p) for p in (e["host"], e["gpu"], e["instance"]) if p is not None)
        for e in entries
    ]
    w = max([len(n) for n in names] + [3])
    lines = [
        f"{'GPU':<{w}} {'MODEL':<26} {'UTIL':>5} {'TEMP':>5} {'XID':>5}  {'VERDICT':<8} CLOCKS"
    ]
    for name, e in zip(names, entries, strict=True):
        util = "-" if e["util_pct"] is None else f"{e['util_pct']}%"
        temp = "-" if e["temp_c"] is None else f"{e['temp_c']}C"
        xid = "-" if e["last_xid"] is None else str(e["last_xid"])
        clocks = ",".join(e["clock_reasons"]) or "-"
        model = (e["model"] or "-")[:26]
        lines.append(
            f"{name:<{w}} {model:<26} {util:>5} {temp:>5} {xid:>5}  {e['verdict']:<8} {clocks}"
        )
        lines.extend(f"    - {reason}" for reason in e["reasons"])
    return lines
