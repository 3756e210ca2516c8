"""``gpugate keys create|list|show|update|rotate|revoke`` against a running gateway."""

from __future__ import annotations

import asyncio
import json

import pytest
from keyed import ENVIRON, TOKEN, keyed_config

from gpugate.cli import main
from harness import serving


async def test_the_keys_commands_create_list_update_rotate_and_revoke_a_key(
    sqlite_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUGATE_ADMIN_TOKEN", TOKEN)
    config = keyed_config(sqlite_dsn, ["http://127.0.0.1:9"], ["m"])
    async with serving(config, environ=ENVIRON) as gw:
        where = ["--gateway", gw.url, "--actor", "ops"]

        async def run(*argv: str) -> str:
            assert 0 == await asyncio.to_thread(main, [*argv, *where])
            return capsys.readouterr().out

        created = json.loads(
            await run(
                "keys",
                "create",
                "--name",
                "ci",
                "--tenant",
                "team-a",
                "--models",
                "m",
                "--max-class",
                "batch",
                "--requests-per-min",
                "60",
            )
        )
        listed = await run("keys", "list")
        shown = json.loads(await run("keys", "show", created["id"]))
        updated = json.loads(await run("keys", "update", created["id"], "--models", "*"))
        rotated = json.loads(await run("keys", "rotate", created["id"]))
        revoked = await run("keys", "revoke", created["id"])
        audit = await gw.gateway.store.list_audit(subject=f"key:{created['id']}")
    assert created["key"].startswith("gk-")
    assert (["m"], "batch", 60) == (
        created["models"],
        created["max_class"],
        created["limits"]["requests_per_min"],
    )
    assert created["id"] in listed
    assert created["prefix"] in listed
    assert created["key"] not in listed
    assert "key" not in shown
    assert updated["models"] is None
    assert rotated["key"] != created["key"]
    assert f"key {created['id']} ({rotated['prefix']}…) revoked" in revoked
    assert {"admin:ops"} == {event.actor for event in audit}


def test_keys_help_names_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["keys", "--help"])
    out = capsys.readouterr().out
    assert all(verb in out for verb in ("create", "list", "show", "update", "rotate", "revoke"))
