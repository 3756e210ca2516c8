"""`gpugate runtimes ...` and `gpugate config ...` against a running gateway's admin API."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
import yaml
from ops_rig import ENV, TOKEN

from gpugate.cli import main
from harness import make_config, serving, upstream

if TYPE_CHECKING:
    from pathlib import Path

Cli = "Callable[..., Awaitable[tuple[int, str, str]]]"


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    monkeypatch.setenv("GPUGATE_ADMIN_TOKEN", TOKEN)

    async def run_cli(*argv: str) -> tuple[int, str, str]:
        code = await asyncio.to_thread(main, list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run_cli


async def test_the_runtimes_commands_list_show_and_change_state(sqlite_dsn: str, run: Cli) -> None:
    config = make_config(sqlite_dsn, [upstream("u1", ["http://127.0.0.1:9"], ["m1"])])
    async with serving(config, environ=ENV) as gw:
        at = ["--gateway", gw.url, "--actor", "carol"]
        cli = run
        drained = await cli("runtimes", "drain", *at, "local", "--reason", "swap the GPU")
        listed = await cli("runtimes", "list", *at)
        shown = await cli("runtimes", "show", *at, "local")
        enabled = await cli("runtimes", "enable", *at, "local")
        unknown = await cli("runtimes", "show", *at, "nope")
    assert (0, "runtime local is drained (by admin:carol)") == (drained[0], drained[1].strip())
    assert "drained" in listed[1]
    assert "swap the GPU" in listed[1]
    assert '"state": "drained"' in shown[1]
    assert "runtime local is enabled (by admin:carol)" == enabled[1].strip()
    assert (1, True) == (unknown[0], "404 UNKNOWN_RUNTIME" in unknown[2])


async def test_the_config_commands_export_import_list_and_roll_back(
    sqlite_dsn: str, run: Cli, tmp_path: Path
) -> None:
    config = make_config(sqlite_dsn, [upstream("u1", ["http://127.0.0.1:9"], ["m1"])])
    exported = tmp_path / "gateway.yaml"
    async with serving(config, environ=ENV) as gw:
        at = ["--gateway", gw.url]
        cli = run
        export = await cli("config", "export", *at, "-o", str(exported))
        same = await cli("config", "import", *at, str(exported))
        document = yaml.safe_load(exported.read_text())
        document["upstreams"][0]["max_inflight"] = 7
        changed_file = tmp_path / "changed.yaml"
        changed_file.write_text(yaml.safe_dump(document))
        changed = await cli("config", "import", *at, str(changed_file))
        broken_file = tmp_path / "broken.yaml"
        broken_file.write_text("upstreams:\n  - id: u1\n    models: [m1]\nfallback_chain: [x]\n")
        broken = await cli("config", "import", *at, str(broken_file))
        rolled = await cli("config", "rollback", *at, "1")
        versions = await cli("config", "versions", *at)
        current = await cli("config", "export", *at)
    assert (0, "exported gateway config version 1") == (export[0], export[2].strip())
    assert "version 1 (unchanged" in same[1]
    assert "version 2 (a new version)" in changed[1]
    assert 1 == broken[0]
    assert "problems" in broken[2]
    assert "fallback_chain[0]" in broken[2]
    assert "(line 4)" in broken[2]
    assert "version 3 = version 1" in rolled[1]
    assert ["3", "2", "1"] == [line[1:].split()[0] for line in versions[1].splitlines()]
    assert exported.read_text() == current[1]
