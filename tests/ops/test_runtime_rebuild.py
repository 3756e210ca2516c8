"""A new config version rebuilds a push or modal runtime whose implementation settings changed
(its push block, its Modal function, its rate); anything the dispatcher reads live leaves the
running implementation in place."""

from __future__ import annotations

import time
from typing import Any

from ops_rig import ENV

from gpugate import push_signature
from gpugate.services.runtimes.push import PushRuntime
from harness import make_config, serving, upstream

SECRETS = {**ENV, "HOME1_SECRET": "s1", "HOME1_NEW_SECRET": "s2"}


def runtimes(push: dict[str, Any], **extra: Any) -> list[dict[str, Any]]:
    home = {"id": "home-1", "kind": "push", "models": ["m1"], "push": push, **extra}
    return [{"id": "local", "kind": "upstream"}, home]


async def test_a_changed_push_block_rebuilds_the_runtime_and_a_live_setting_does_not(
    sqlite_dsn: str,
) -> None:
    first = {"url": "http://127.0.0.1:9/calls", "secret_env": "HOME1_SECRET"}
    moved = {"url": "http://127.0.0.1:10/calls", "secret_env": "HOME1_NEW_SECRET"}

    def config(push: dict[str, Any], **extra: Any) -> Any:
        return make_config(
            sqlite_dsn,
            [upstream("u1", ["http://127.0.0.1:9"], ["m1"])],
            runtimes=runtimes(push, **extra),
            fallback_chain=["local", "home-1"],
        )

    async with serving(config(first), environ=SECRETS) as gw:
        gateway = gw.gateway
        original = gateway.runtimes["home-1"]
        local = gateway.runtimes["local"]
        gateway.apply_config(config(first, max_concurrency=5), gateway.config_version + 1)
        after_live_change = gateway.runtimes["home-1"]
        gateway.apply_config(config(moved, max_concurrency=5), gateway.config_version + 1)
        rebuilt = gateway.runtimes["home-1"]
        key = push_signature.derive_key("s2", push_signature.WORKER_TO_GATEWAY)
        report = {"method": "POST", "target": "/v1/jobs/j/lease", "body": b"", "lease_token": "t"}
        signature = push_signature.sign_request(
            key, push_signature.WORKER_TO_GATEWAY, now=time.time(), **report
        )
        accepted, _ = gateway.push_keys.authenticate(signature, None, now=time.time(), **report)

    assert original is after_live_change
    assert isinstance(rebuilt, PushRuntime)
    assert rebuilt is not original
    assert "http://127.0.0.1:10/calls" == rebuilt.url
    assert local is gateway.runtimes["local"]
    assert {"home-1"} == accepted
