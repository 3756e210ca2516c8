"""Runtimes through the admin API: list and detail, enable / disable / drain (persisted, audited,
followed by the dispatcher and by other replicas), and the audit log's filters."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aiohttp
from ops_rig import ENV, Admin

from harness import make_config, model_servers, serving, upstream

if TYPE_CHECKING:
    from gpugate.config import GatewayConfig
    from gpugate.store import JobRecord, Store

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def fleet_config(dsn: str, url: str) -> GatewayConfig:
    return make_config(
        dsn,
        [upstream("u1", [url], ["m1"])],
        runtimes=[
            {"id": "local", "kind": "upstream"},
            {
                "id": "home-1",
                "kind": "push",
                "models": ["m1"],
                "push": {"url": "http://127.0.0.1:9/calls", "secret_env": "HOME1_SECRET"},
                "budget": {"daily_cents": 1000, "cents_per_second": 0.02},
            },
        ],
        fallback_chain=["local", "home-1"],
    )


async def finished(store: Store, slug: str) -> JobRecord:
    async with asyncio.timeout(10):
        while True:
            job = await store.get_job(slug)
            if job is not None and job.terminal:
                return job
            await asyncio.sleep(0.02)


async def submit(http: aiohttp.ClientSession, url: str, slug: str) -> None:
    body = {"model": "m1", "input": CHAT, "slug": slug}
    async with http.post(url + "/v1/jobs", json=body) as resp:
        assert 202 == resp.status


ENV_WITH_SECRET = {**ENV, "HOME1_SECRET": "worker-secret"}


async def test_the_list_shows_every_runtime_with_queue_flight_state_and_spend(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("s1", ["m1"])) as (s1,):
        async with serving(fleet_config(sqlite_dsn, s1.url), environ=ENV_WITH_SECRET) as gw:
            reply = await Admin(http, gw.url).call("GET", "/admin/runtimes")
    local, home = reply.body["runtimes"]
    assert ("local", "home-1") == (local["id"], home["id"])
    assert (0, 0, None) == (local["queue_depth"], local["in_flight"], local["last_submit"])
    assert {"state": "enabled", "reachable": True, "implemented": True} == {
        k: local["health"][k] for k in ("state", "reachable", "implemented")
    }
    assert (None, True) == (home["health"]["reachable"], home["health"]["implemented"])
    assert {"daily_cents": 1000, "today_cents": 0.0, "ledger": [], "over_budget": False} == {
        k: home["spend"][k] for k in ("daily_cents", "today_cents", "ledger", "over_budget")
    }
    assert 14 == len(home["spend"]["days"])
    assert {"daily_cents": None, "today_cents": None, "days": []} == {
        k: local["spend"][k] for k in ("daily_cents", "today_cents", "days")
    }


async def test_a_disabled_runtime_is_skipped_and_an_enabled_one_runs_again(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("s1", ["m1"])) as (s1,):
        async with serving(fleet_config(sqlite_dsn, s1.url), environ=ENV_WITH_SECRET) as gw:
            admin = Admin(http, gw.url)
            disabled = await admin.call(
                "POST", "/admin/runtimes/local/disable", json={"reason": "bad driver"}
            )
            await submit(http, gw.url, "while-disabled")
            skipped = await finished(gw.gateway.store, "while-disabled")
            detail = await admin.call("GET", "/admin/runtimes/local")
            await admin.call("POST", "/admin/runtimes/local/enable")
            await submit(http, gw.url, "after-enable")
            ran = await finished(gw.gateway.store, "after-enable")
            after = await admin.call("GET", "/admin/runtimes/local")
    assert {"runtime": "local", "state": "disabled", "reason": "bad driver"} == {
        k: disabled.body[k] for k in ("runtime", "state", "reason")
    }
    assert "admin:alice" == disabled.body["actor"]
    assert ("failed", "CHAIN_EXHAUSTED") == (skipped.state, skipped.error_code)
    assert "local: skipped (disabled)" in (skipped.error_message or "")
    health = detail.body["health"]
    assert ("disabled", "bad driver", False) == (
        health["state"],
        health["reason"],
        health["takes_dispatch"],
    )
    assert "completed" == ran.state
    last = after.body["last_submit"]
    assert ("after-enable", "completed") == (last["job"], last["outcome"])
    assert ["runtime.enabled", "runtime.disabled"] == [
        e["action"] for e in after.body["health"]["history"]
    ]


async def test_a_drained_runtime_takes_no_new_dispatch(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("s1", ["m1"])) as (s1,):
        async with serving(fleet_config(sqlite_dsn, s1.url), environ=ENV_WITH_SECRET) as gw:
            reply = await Admin(http, gw.url).call("POST", "/admin/runtimes/local/drain")
            await submit(http, gw.url, "while-drained")
            job = await finished(gw.gateway.store, "while-drained")
    assert "drained" == reply.body["state"]
    assert 0 == s1.stats.executions.get("while-drained", 0)
    assert "local: skipped (disabled)" in (job.error_message or "")


async def test_an_auto_disable_shows_in_the_runtimes_auto_disable_history(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with serving(fleet_config(sqlite_dsn, "http://127.0.0.1:9"), environ=ENV) as gw:
        store = gw.gateway.store
        await store.set_runtime_state("local", "disabled", "max_stuck: 4 stuck calls", "gateway")
        ops = gw.gateway.runtime_ops
        assert ops is not None
        await ops.tick()
        await Admin(http, gw.url).call("POST", "/admin/runtimes/local/enable")
        detail = await Admin(http, gw.url).call("GET", "/admin/runtimes/local")
    (auto,) = detail.body["health"]["auto_disables"]
    assert ("gateway", "max_stuck: 4 stuck calls") == (auto["actor"], auto["detail"]["reason"])
    assert "enabled" == detail.body["health"]["state"]


async def test_a_state_set_on_one_replica_holds_on_another_and_after_a_restart(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    config = fleet_config(sqlite_dsn, "http://127.0.0.1:9")
    async with serving(config, environ=ENV) as first, serving(config, environ=ENV) as second:
        await Admin(http, first.url).call("POST", "/admin/runtimes/local/drain")
        ops = second.gateway.runtime_ops
        assert ops is not None
        before = ops.excluded()
        await ops.tick()
        after = ops.excluded()
    async with serving(config, environ=ENV) as restarted:
        on_restart = restarted.gateway.runtime_ops.excluded()
    assert (frozenset(), {"local"}, {"local"}) == (before, after, on_restart)


async def test_an_unknown_runtime_is_404_and_no_token_is_401(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with serving(fleet_config(sqlite_dsn, "http://127.0.0.1:9"), environ=ENV) as gw:
        admin = Admin(http, gw.url)
        unknown = [
            await admin.call("GET", "/admin/runtimes/nope"),
            await admin.call("POST", "/admin/runtimes/nope/disable"),
        ]
        anonymous = Admin(http, gw.url, token=None)
        refused = [
            await anonymous.call("GET", "/admin/runtimes"),
            await anonymous.call("POST", "/admin/runtimes/local/drain"),
            await anonymous.call("GET", "/admin/audit"),
        ]
        states = await gw.gateway.store.runtime_states()
    assert [(404, "UNKNOWN_RUNTIME")] * 2 == [(r.status, r.code) for r in unknown]
    assert [(401, "UNAUTHORIZED")] * 3 == [(r.status, r.code) for r in refused]
    assert {} == states


async def test_the_audit_log_filters_by_action_subject_actor_since_and_pages(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with serving(fleet_config(sqlite_dsn, "http://127.0.0.1:9"), environ=ENV) as gw:
        alice, bob = Admin(http, gw.url), Admin(http, gw.url, actor="bob")
        await alice.call("POST", "/admin/runtimes/local/disable")
        await bob.call("POST", "/admin/runtimes/local/enable")
        await bob.call("POST", "/admin/runtimes/home-1/drain")
        by_bob = await alice.call("GET", "/admin/audit?actor=admin:bob")
        drained = await alice.call("GET", "/admin/audit?action=runtime.drained")
        local = await alice.call("GET", "/admin/audit?subject=runtime:local&limit=1")
        cursor = local.body["next_cursor"]
        page2 = await alice.call(
            "GET", f"/admin/audit?subject=runtime:local&limit=1&cursor={cursor}"
        )
        future = await alice.call("GET", "/admin/audit?since=2999-01-01T00:00:00%2B00:00")
        naive = await alice.call("GET", "/admin/audit?since=2020-01-01T00:00:00")
    assert ["runtime.drained", "runtime.enabled"] == [e["action"] for e in by_bob.body["data"]]
    assert ["runtime:home-1"] == [e["subject"] for e in drained.body["data"]]
    assert ["runtime.enabled"] == [e["action"] for e in local.body["data"]]
    assert ["runtime.disabled"] == [e["action"] for e in page2.body["data"]]
    assert [] == future.body["data"]
    assert (400, "BAD_REQUEST") == (naive.status, naive.code)
