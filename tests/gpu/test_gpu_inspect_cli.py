"""`gpugate gpus inspect SOURCE --json`, as an operator runs it, on every real scrape."""

from __future__ import annotations

import json

import pytest
from gpu_factories import fixture_dir
from test_gpu_fixtures import EXPECTED

from gpugate.cli import main
from gpugate.fleet import FakeExporter


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_inspect_json_shows_the_util_and_temperature_each_fixture_holds(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["gpus", "inspect", str(fixture_dir() / name), "--json"])
    out = json.loads(capsys.readouterr().out)
    rows = [(e["host"], e["gpu"], e["instance"], e["util_pct"], e["temp_c"]) for e in out["gpus"]]
    assert EXPECTED[name] == rows
    assert (0 if rows else 1) == code
    assert ([] if rows else ["no DCGM GPU series in the scrape"]) == out["errors"]
    keys = {"host", "gpu", "instance", "uuid", "model", "util_pct", "temp_c", "last_xid"}
    keys |= {"clock_reasons", "verdict", "reasons"}
    assert all(keys <= set(entry) for entry in out["gpus"])


async def test_inspect_reads_a_live_exporter_and_says_why_a_gpu_is_faulted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import asyncio

    async with FakeExporter(2) as exporter:
        exporter.set_gpu(1, xid=79, clock_reasons=0x40 | 0x1)
        code = await asyncio.to_thread(main, ["gpus", "inspect", exporter.metrics_url, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert 0 == code
    gpu1 = next(e for e in out["gpus"] if e["gpu"] == 1)
    assert ("faulted", 79) == (gpu1["verdict"], gpu1["last_xid"])
    assert ["gpu_idle", "hw_thermal"] == gpu1["clock_reasons"]
    assert any("XID 79" in reason for reason in gpu1["reasons"])
    assert any("hw_thermal" in reason for reason in gpu1["reasons"])


def test_inspect_of_an_unreachable_exporter_is_an_error_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["gpus", "inspect", "http://127.0.0.1:9/metrics", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert (1, []) == (code, out["gpus"])
    assert out["errors"][0].startswith("UPSTREAM_UNREACHABLE")
