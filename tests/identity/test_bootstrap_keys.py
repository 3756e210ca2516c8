"""Bootstrap keys from the environment (``auth.bootstrap_keys_env``): stored as hashes at start,
usable at once; a malformed entry stops the start naming the variable, never the secret."""

from __future__ import annotations

import json

import aiohttp
import pytest
from keyed import ENVIRON, bearer, chat, keyed_config

from gpugate.errors import ConfigError
from gpugate.wiring import build_gateway
from harness import model_servers, serving

SECRET = "gk-bootstrap-" + "s" * 32


async def test_a_bootstrap_key_works_at_once_and_is_stored_only_as_its_hash(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    keys = [{"name": "ci", "tenant": "ops", "key": SECRET, "max_class": "system"}]
    environ = {**ENVIRON, "BOOT_KEYS": json.dumps(keys)}
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(dsn, [server.url], ["m"], auth={"bootstrap_keys_env": "BOOT_KEYS"})
        async with serving(config, environ=environ) as gw:
            async with http.post(
                gw.url + "/v1/chat/completions", json=chat(), headers=bearer(SECRET)
            ) as resp:
                status = resp.status
            stored = await gw.gateway.store.get_key("boot-ci")
    assert 200 == status
    assert stored is not None
    assert ("ops", "system", SECRET[:11]) == (stored.tenant, stored.max_class.value, stored.prefix)


@pytest.mark.parametrize(
    ("entry", "where"),
    [
        ({"name": "ci", "tenant": "ops", "key": "short"}, "BOOT_KEYS[0].key"),
        ({"name": "ci", "tenant": "a:b", "key": SECRET}, "BOOT_KEYS[0].tenant"),
        ({"tenant": "ops", "key": SECRET}, "BOOT_KEYS[0]"),
    ],
)
async def test_a_bad_bootstrap_key_stops_the_start_naming_the_entry_not_the_secret(
    sqlite_dsn: str, entry: dict[str, str], where: str
) -> None:
    environ = {**ENVIRON, "BOOT_KEYS": json.dumps([entry])}
    config = keyed_config(
        sqlite_dsn, ["http://127.0.0.1:9"], ["m"], auth={"bootstrap_keys_env": "BOOT_KEYS"}
    )
    with pytest.raises(ConfigError) as refused:
        async with build_gateway(config, environ=environ, run_job_loops=False):
            pass
    assert where in str(refused.value)
    assert SECRET not in str(refused.value)
