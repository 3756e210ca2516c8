"""Finding 1 (issue #15): ``/u/{upstream}/{path}`` was an open proxy that escaped the upstream's
base path and added the upstream's credential itself.

The decoded path was appended to the endpoint URL, so ``..`` (plain or ``%2F``-smuggled) left the
base path, ``%3F``/``%23`` became a query or a fragment, and every request to a keyed upstream
carried ``Authorization: Bearer <its key>`` — including a ``DELETE`` on an admin route. Now the
raw path is forwarded as sent, refused (400) when its meaning depends on who decodes it, and an
``azure-di``, external or keyed upstream is reachable only through its ``raw:`` opt-in, without
its key unless ``raw.send_key``. The requests are sent byte for byte (``raw_rig.send_raw``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from raw_rig import Rig, recording_upstream, send_raw

from harness import make_config, serving, upstream

KEY = "sk-upstream-secret"
ENV = {"EXT_KEY": KEY}


@pytest.fixture
async def rig(sqlite_dsn: str) -> AsyncIterator[Rig]:
    async with recording_upstream() as up:
        raw_opt_in = {"methods": ["GET", "POST"], "path_prefixes": ["/v1/"]}
        config = make_config(
            sqlite_dsn,
            [
                upstream("int", [up.url], ["m-int"]),
                upstream("keyed", [up.url], ["m-keyed"], api_key_env="EXT_KEY"),
                upstream("ext", [up.url], ["m-ext"], external=True),
                upstream("di", [up.url], ["prebuilt-read"], kind="azure-di", api_key_env="EXT_KEY"),
                upstream("opted", [up.url], ["m-opted"], api_key_env="EXT_KEY", raw=raw_opt_in),
                upstream(
                    "sends-key",
                    [up.url],
                    ["m-sends"],
                    api_key_env="EXT_KEY",
                    external=True,
                    raw={**raw_opt_in, "send_key": True},
                ),
            ],
        )
        async with serving(config, environ=ENV) as gw:
            yield Rig(gw, up)


@pytest.mark.parametrize(
    "target",
    [
        "/u/int/../../v1/organization/admin_api_keys/key_1",
        "/u/int/v1/../../secret",
        "/u/int/./v1/models",
        "/u/int/v1/%2e%2e/%2E%2E/secret",
        "/u/int/x%2F..%2F..%2Fsecret",
        "/u/int/x%2f..%2fsecret",
        "/u/int/v1/models%3Fadmin=1",
        "/u/int/v1/models%23frag",
        "/u/int/v1/a%5C..%5Csecret",
        "/u/int/v1/bad%zzescape",
    ],
)
async def test_finding1_paths_that_could_leave_the_base_path_are_refused_with_400(
    rig: Rig, target: str
) -> None:
    answer = await send_raw(rig.gw.url, "DELETE", target)
    assert (400, "BAD_REQUEST") == (answer.status, answer.error_code())
    assert [] == rig.up.seen


async def test_finding1_the_raw_path_is_forwarded_as_sent_below_the_base_path(rig: Rig) -> None:
    answer = await send_raw(rig.gw.url, "GET", "/u/int/v1/files/a%20b;c=d?q=a%20b&x=1")
    assert 200 == answer.status
    assert ["/base/v1/files/a%20b;c=d?q=a%20b&x=1"] == [s.target for s in rig.up.seen]


@pytest.mark.parametrize(
    ("upstream_id", "why"),
    [("keyed", "with a key"), ("ext", "external"), ("di", "azure-di")],
)
async def test_finding1_keyed_external_and_azure_di_upstreams_are_not_reachable_without_opt_in(
    rig: Rig, upstream_id: str, why: str
) -> None:
    answer = await send_raw(
        rig.gw.url, "DELETE", f"/u/{upstream_id}/v1/organization/admin_api_keys/key_1"
    )
    assert (403, "RAW_FORBIDDEN") == (answer.status, answer.error_code())
    assert why in answer.json()["error"]["message"]
    assert [] == rig.up.seen


async def test_finding1_an_opted_in_upstream_gets_only_its_methods_and_prefixes_and_never_its_key(
    rig: Rig,
) -> None:
    allowed = await send_raw(
        rig.gw.url, "GET", "/u/opted/v1/models", headers={"Authorization": "Bearer client-own"}
    )
    wrong_method = await send_raw(rig.gw.url, "DELETE", "/u/opted/v1/models")
    wrong_prefix = await send_raw(rig.gw.url, "GET", "/u/opted/admin/keys")
    assert [200, 403, 403] == [allowed.status, wrong_method.status, wrong_prefix.status]
    assert ["/base/v1/models"] == [s.target for s in rig.up.seen]
    sent = rig.up.seen[0].headers
    assert "Bearer client-own" == sent.get("Authorization")  # the client's own, never ours
    assert KEY not in str(sent)


async def test_finding1_the_upstream_key_is_added_only_with_raw_send_key(rig: Rig) -> None:
    answer = await send_raw(
        rig.gw.url, "POST", "/u/sends-key/v1/embeddings", headers={"Authorization": "Bearer x"}
    )
    assert 200 == answer.status
    assert [f"Bearer {KEY}"] == [s.headers.get("Authorization") for s in rig.up.seen]


async def test_finding1_an_internal_keyless_upstream_keeps_every_method_and_path(rig: Rig) -> None:
    answers = [
        await send_raw(rig.gw.url, method, "/u/int/anything/at/all")
        for method in ("GET", "POST", "PUT", "PATCH", "DELETE")
    ]
    assert [200] * 5 == [a.status for a in answers]
    assert ["GET", "POST", "PUT", "PATCH", "DELETE"] == [s.method for s in rig.up.seen]


async def test_finding1_x_allow_external_false_refuses_an_external_upstream_as_the_facade_does(
    rig: Rig,
) -> None:
    refused = await send_raw(
        rig.gw.url, "POST", "/u/sends-key/v1/embeddings", headers={"X-Allow-External": "false"}
    )
    internal = await send_raw(
        rig.gw.url, "GET", "/u/int/v1/models", headers={"X-Allow-External": "false"}
    )
    assert (403, "EXTERNAL_UPSTREAM_FORBIDDEN") == (refused.status, refused.error_code())
    assert 200 == internal.status
    assert ["/base/v1/models"] == [s.target for s in rig.up.seen]
