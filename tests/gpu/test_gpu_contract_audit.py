"""DESIGN §4 (GPU health) as an acceptance check drives it: a real ``gpugate serve`` subprocess
reading a dcgm-exporter stand-in over loopback HTTP whose answers the test changes between
polls, with fake model servers behind it.

The monitor polls on its own (``poll_s`` 0.3 s); "within two polls" is counted in scrapes, not
slept for: a monitor starts its next scrape only after it published the previous one, so once
the exporter has answered two more scrapes after a change, the first of them is in effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gpu_factories import TABLE, ScrapeServer, dcgm_line, fed, reading, thresholds

from gpugate.adapters.exposition import parse
from gpugate.cli import main
from gpugate.config import GatewayConfig
from gpugate.core.gpu.health import assess, clear, observe
from gpugate.fleet import ModelServer
from harness import eventually, make_config, upstream
from workers.processes import serve_process, write_config

e2e = pytest.mark.e2e
TOKEN = "audit-admin-token"
POLL_S = 0.3
SERIES = {
    "util": "DCGM_FI_DEV_GPU_UTIL",
    "temp": "DCGM_FI_DEV_GPU_TEMP",
    "xid": "DCGM_FI_DEV_XID_ERRORS",
    "clock": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
}
COOL = {"util": 10, "temp": 50, "xid": 0, "clock": 0}
HOT = {**COOL, "util": 99}
GPU_FAMILIES = (
    "gateway_gpu_util_percent",
    "gateway_gpu_temperature_celsius",
    "gateway_gpu_last_xid",
    "gateway_gpu_faulted",
    "gateway_gpu_saturated",
    "gateway_gpu_stale",
)
"""The per-GPU families docs/gpu-health.md names (labels host, gpu, instance)."""
XID_79 = "XID 79 (GPU_HAS_FALLEN_OFF_THE_BUS): fatal"
XID_13 = "XID 13 (GR_EXCEPTION): not fatal"


def exposition(*gpus: Mapping[str, Any]) -> bytes:
    """One scrape of GPUs 0, 1, ... on host ``node-a``: each given series, and for ``counts``
    one ``DCGM_EXP_XID_ERRORS_COUNT{xid}`` per code."""
    lines = []
    for index, fields in enumerate(gpus):
        for name, value in fields.items():
            if name == "counts":
                lines += [
                    dcgm_line(
                        "DCGM_EXP_XID_ERRORS_COUNT",
                        count,
                        gpu=index,
                        window_size_in_ms="300000",
                        xid=str(xid),
                    )
                    for xid, count in value.items()
                ]
            else:
                lines.append(dcgm_line(SERIES[name], value, gpu=index))
    return ("\n".join(lines) + "\n").encode()


async def until(check: Callable[[], Awaitable[bool]], what: str, within_s: float = 20.0) -> None:
    """Until the async ``check()`` holds; fail naming ``what`` if it does not in time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not await check():
        if loop.time() > deadline:
            pytest.fail(f"{what} did not hold within {within_s} s")
        await asyncio.sleep(0.05)


@dataclass
class Served:
    """A running ``gpugate serve`` and what the test steers."""

    config: GatewayConfig
    url: str
    exporter: ScrapeServer
    servers: dict[str, ModelServer]
    http: aiohttp.ClientSession

    async def polls(self, count: int = 2) -> None:
        """Until ``count`` more scrapes were answered: the first of them is in effect."""
        target = self.exporter.scrapes + count
        await eventually(
            lambda: self.exporter.scrapes >= target,
            within_s=count * POLL_S + 20,
            what=f"{count} more polls",
        )

    async def admin(
        self, method: str, path: str, token: str | None = TOKEN, *, fresh: bool = False
    ) -> tuple[int, Any]:
        """An admin call; ``fresh``: on a new connection (with several workers, the kernel
        hands each new connection to one of them)."""
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        async with contextlib.AsyncExitStack() as stack:
            http = self.http
            if fresh:
                connector = aiohttp.TCPConnector(force_close=True)
                http = await stack.enter_async_context(aiohttp.ClientSession(connector=connector))
            async with http.request(method, self.url + path, headers=headers) as resp:
                return resp.status, await resp.json()

    async def gpus(self) -> dict[int, dict[str, Any]]:
        status, body = await self.admin("GET", "/admin/gpus")
        assert 200 == status, body
        return {row["gpu"]: row for row in body["gpus"]}

    async def out_of_rotation(self, *, fresh: bool = False) -> dict[str, str | None]:
        status, body = await self.admin("GET", "/admin/upstreams", fresh=fresh)
        assert 200 == status, body
        return {u["id"]: u["out_of_rotation"] for u in body["upstreams"]}

    async def chat(self, cls: str | None = None) -> tuple[int, Mapping[str, str], Any]:
        headers = {"X-Request-Class": cls} if cls else {}
        body = {"model": "m", "messages": [{"role": "user", "content": uuid.uuid4().hex}]}
        async with self.http.post(
            self.url + "/v1/chat/completions", json=body, headers=headers
        ) as resp:
            return resp.status, resp.headers.copy(), await resp.json()

    async def samples(self, name: str, label: str) -> dict[str, float]:
        """The ``/metrics`` samples called ``name``, by the value of their label ``label``."""
        async with self.http.get(self.url + "/metrics") as resp:
            text = await resp.read()
        return {s.labels[label]: s.value for s in parse(text) if s.name == name}

    async def gauges(self) -> dict[tuple[str, str], float]:
        """The per-GPU samples of ``/metrics``, by (family, gpu index)."""
        return {
            (family, gpu): value
            for family in GPU_FAMILIES
            for gpu, value in (await self.samples(family, "gpu")).items()
        }

    async def shed_total(self, site: str) -> float:
        return (await self.samples("gateway_gpu_shed_total", "site")).get(site, 0.0)


@contextlib.asynccontextmanager
async def served(
    dsn: str,
    body: bytes,
    *,
    external: bool = False,
    workers: int | None = None,
    **gpu_health: Any,
) -> AsyncIterator[Served]:
    """``gpugate serve`` with upstreams ``u0`` on GPU 0 and ``u1`` on GPU 1 (and with
    ``external`` an ``ext`` upstream on no GPU of ours), all serving model ``m``, reading one
    exporter that answers ``body``; the start-up poll is in when the block begins."""
    names = ["s0", "s1", *(["ext"] if external else [])]
    async with contextlib.AsyncExitStack() as stack:
        exporter = await stack.enter_async_context(ScrapeServer(body))
        servers = {
            name: await stack.enter_async_context(ModelServer(["m"], name=name)) for name in names
        }
        ups = [
            upstream("u0", [servers["s0"].url], ["m"], gpu_ids=[0]),
            upstream("u1", [servers["s1"].url], ["m"], gpu_ids=[1]),
        ]
        if external:
            ups.append(upstream("ext", [servers["ext"].url], ["m"], external=True))
        health = {
            "dcgm_url": exporter.metrics_url,
            "poll_s": POLL_S,
            "staleness_s": 3.0,
            "scrape_timeout_s": 2.0,
            **gpu_health,
        }
        config = make_config(dsn, ups, gpu_health=health)
        url, _, _ = await stack.enter_async_context(
            serve_process(config, workers=workers, environ={"GPUGATE_ADMIN_TOKEN": TOKEN})
        )
        http = await stack.enter_async_context(aiohttp.ClientSession())
        running = Served(config, url, exporter, servers, http)
        await running.polls(1)
        yield running


# -- faults: timing, XID semantics, clear, the guard ------------------------------------------


@e2e
async def test_serve_faults_take_effect_within_two_polls_and_an_operator_clear_at_once(
    sqlite_dsn: str,
) -> None:
    async with served(sqlite_dsn, exposition(COOL, COOL)) as s:
        assert {"u0": None, "u1": None} == await s.out_of_rotation()

        s.exporter.body = exposition(COOL, {**COOL, "xid": 79})  # a change to a fatal code
        await s.polls(2)
        out = await s.out_of_rotation()
        answered = {(await s.chat())[1]["X-Gateway-Upstream"] for _ in range(12)}
        faulted = (await s.gpus())[1]

        cleared = await s.admin("POST", "/admin/gpus/1/clear")
        at_once = await s.out_of_rotation()  # no poll in between
        await s.polls(2)
        sticky = await s.out_of_rotation()  # the same sticky 79 is no change: it stays cleared

        s.exporter.body = exposition(COOL, {**COOL, "xid": 13})  # a change to a non-fatal code
        await s.polls(2)
        noted = (await s.gpus())[1]
        s.exporter.body = exposition(COOL, {**COOL, "xid": 79})  # 13 -> 79 is a change again
        await s.polls(2)
        again = await s.out_of_rotation()

        s.exporter.body = exposition({**COOL, "clock": 0x40 | 0x01}, {**COOL, "xid": 79})
        await s.polls(2)
        status, headers, refused = await s.chat()

    assert out["u0"] is None
    assert out["u1"] is not None
    assert XID_79 in out["u1"]
    assert {"u0"} == answered
    assert ("faulted", XID_79) == (faulted["verdict"], faulted["fault_reason"])
    assert faulted["faulted_since"]
    assert (200, ["node-a/1"]) == (cleared[0], cleared[1]["cleared"])
    assert {"u0": None, "u1": None} == at_once == sticky
    assert ("ok", [XID_13], None) == (noted["verdict"], noted["reasons"], noted["fault_reason"])
    assert again["u1"] is not None
    assert (503, "NO_HEALTHY_UPSTREAM") == (status, refused["error"]["code"])
    assert {"message", "type", "code"} <= set(refused["error"])
    assert "hw_thermal clock event" in refused["error"]["message"]
    assert int(headers["Retry-After"]) >= 1


@e2e
async def test_serve_with_two_workers_an_operator_clear_reaches_both_within_a_few_polls(
    sqlite_dsn: str,
) -> None:
    """The clear lands on one worker; on main the other kept the fault for ``fault_hold_s``
    (its upstreams out of rotation for the clients that worker serves)."""
    async with served(sqlite_dsn, exposition(COOL, {**COOL, "xid": 79}), workers=2) as s:

        async def everywhere(out: bool) -> bool:
            views = [await s.out_of_rotation(fresh=True) for _ in range(16)]
            return all((view["u1"] is not None) == out for view in views)

        await until(lambda: everywhere(out=True), "both workers hold the fault")
        status, body = await s.admin("POST", "/admin/gpus/1/clear")
        # a few polls of each worker (0.3 s apart); the hold the other worker had is 300 s
        await until(lambda: everywhere(out=False), "the clear reached both workers", 10.0)

    assert (200, ["node-a/1"]) == (status, body["cleared"])


@e2e
async def test_serve_admin_gpu_routes_need_the_admin_token_and_clear_knows_its_gpus(
    sqlite_dsn: str,
) -> None:
    async with served(sqlite_dsn, exposition(COOL, {**COOL, "xid": 79})) as s:
        refusals = [
            (await s.admin(method, path, token))[0]
            for method, path in (("GET", "/admin/gpus"), ("POST", "/admin/gpus/1/clear"))
            for token in (None, "wrong-token")
        ]
        still = await s.out_of_rotation()
        unknown = await s.admin("POST", "/admin/gpus/7/clear")
        other_host = await s.admin("POST", "/admin/gpus/node-b/1/clear")
        malformed = await s.admin("POST", "/admin/gpus/zero/clear")
        _, audit = await s.admin("GET", "/admin/audit")

    assert [401] * 4 == refusals
    assert still["u1"] is not None, "a refused clear cleared nothing"
    # a GPU no exporter has shown: nothing was cleared, and the operator is told so
    assert (404, "UNKNOWN_GPU") == (unknown[0], unknown[1]["error"]["code"])
    assert "node-a/1" in unknown[1]["error"]["message"]
    assert (404, "UNKNOWN_GPU") == (other_host[0], other_host[1]["error"]["code"])
    assert (400, "BAD_REQUEST") == (malformed[0], malformed[1]["error"]["code"])
    assert not [e for e in audit["data"] if e["action"] == "gpu.cleared"]


@e2e
async def test_serve_a_fault_whose_evidence_every_scrape_shows_holds_with_fault_hold_s_0(
    sqlite_dsn: str,
) -> None:
    """``fault_hold_s: 0`` is allowed: no hold after the last evidence. A GPU that throttles
    on every scrape must still be out of rotation — on main no fault ever held (the hold had
    run out by the time the verdict was read), nor did a positive XID count."""
    async with served(sqlite_dsn, exposition(COOL, COOL), fault_hold_s=0) as s:
        s.exporter.body = exposition(COOL, {**COOL, "clock": 0x40})
        await s.polls(2)
        thermal = await s.out_of_rotation()
        since = (await s.gpus())[1]["faulted_since"]
        await s.polls(2)
        later = await s.out_of_rotation()
        since_later = (await s.gpus())[1]["faulted_since"]

        s.exporter.body = exposition(COOL, COOL)
        await s.polls(2)
        released = await s.out_of_rotation()

        s.exporter.body = exposition(COOL, {**COOL, "counts": {48: 1}})  # one XID 48 in the window
        await s.polls(2)
        counted = await s.out_of_rotation()
        await s.polls(2)
        counted_later = await s.out_of_rotation()
        s.exporter.body = exposition(COOL, COOL)  # out of the window
        await s.polls(2)
        drained = await s.out_of_rotation()

    assert thermal["u1"] is not None
    assert "hw_thermal" in thermal["u1"]
    assert later["u1"] is not None
    assert since is not None
    assert since_later is not None
    moved = datetime.fromisoformat(since_later) - datetime.fromisoformat(since)
    assert abs(moved.total_seconds()) < POLL_S, "a continuing fault keeps its since"
    assert released["u1"] is None
    assert counted["u1"] is not None
    assert "XID 48" in counted["u1"]
    assert counted_later["u1"] is not None
    assert drained["u1"] is None


@e2e
async def test_serve_admin_gpus_and_gpus_inspect_with_its_config_judge_a_scrape_alike(
    sqlite_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/gpu-health.md: the gateway shows inspect's entry per GPU. With ``xid_overrides`` and
    ``max_temp_c`` set, only ``gpus inspect --config`` judges as that gateway does (on main
    inspect knew the defaults only: XID 109 "not fatal", 85 °C fine)."""
    body = exposition({**COOL, "xid": 109}, {**COOL, "temp": 85})
    health = {"xid_overrides": {109: "fatal"}, "max_temp_c": 80}
    async with served(sqlite_dsn, body, **health) as s:
        listed = await s.gpus()
        path = write_config(s.config, tmp_path)
        capsys.readouterr()
        code = await asyncio.to_thread(
            main, ["gpus", "inspect", s.exporter.metrics_url, "--json", "--config", str(path)]
        )
        inspected = {e["gpu"]: e for e in json.loads(capsys.readouterr().out)["gpus"]}

    live = {"upstreams", "stale", "saturated", "fault_reason", "faulted_since"}
    assert 0 == code
    assert {
        gpu: {k: v for k, v in row.items() if k not in live} for gpu, row in listed.items()
    } == (inspected)
    assert ["XID 109 (CTXSW_TIMEOUT_ERROR): fatal (override)"] == inspected[0]["reasons"]
    assert ["temperature 85 °C ≥ 80"] == inspected[1]["reasons"]


# -- metrics ----------------------------------------------------------------------------------


@e2e
async def test_serve_gpu_gauges_show_what_the_newest_scrape_holds_and_nothing_of_a_forgotten_gpu(
    sqlite_dsn: str,
) -> None:
    no_util = {key: value for key, value in COOL.items() if key != "util"}
    async with served(sqlite_dsn, exposition(COOL, COOL)) as s:
        first = await s.gauges()
        s.exporter.script = [(200, b"<html><body>502 Bad Gateway</body></html>")]
        await s.polls(2)
        after_garbage = (await s.gauges(), await s.samples("gateway_gpu_scrapes_total", "outcome"))

        s.exporter.body = exposition(no_util, COOL)  # GPU 0's util series is gone: unknown
        await s.polls(2)
        without_util = await s.gauges()

        s.exporter.body = exposition(COOL)  # GPU 1 vanished: fault evidence (off the bus?)
        await s.polls(2)
        missing = await s.gauges()
        cleared = await s.admin("POST", "/admin/gpus/1/clear")  # forgets the missing GPU
        forgotten = await s.gauges()
        rows = await s.gpus()

    assert {(family, gpu) for family in GPU_FAMILIES for gpu in "01"} == set(first)
    assert (10.0, 50.0, 0.0, 0.0) == tuple(
        first[family, "1"]
        for family in (
            "gateway_gpu_util_percent",
            "gateway_gpu_temperature_celsius",
            "gateway_gpu_last_xid",
            "gateway_gpu_faulted",
        )
    )
    gauges, scrapes = after_garbage
    assert first == gauges, "a garbage scrape changed no verdict"
    assert scrapes["error"] >= 1
    assert ("gateway_gpu_util_percent", "0") not in without_util
    assert 50.0 == without_util["gateway_gpu_temperature_celsius", "0"]
    assert 10.0 == without_util["gateway_gpu_util_percent", "1"]
    assert 1.0 == missing["gateway_gpu_faulted", "1"]
    assert 200 == cleared[0]
    assert [] == [key for key in forgotten if key[1] == "1"]
    assert [0] == sorted(rows)


# -- saturation and the shed gate ----------------------------------------------------------------


@e2e
async def test_serve_batch_is_shed_only_when_every_candidate_is_saturated_over_a_full_ring(
    sqlite_dsn: str,
) -> None:
    async with served(
        sqlite_dsn, exposition(COOL, COOL), shed_batch=True, sustained_samples=2
    ) as s:
        s.exporter.body = exposition(HOT, HOT)
        await s.polls(3)  # two fresh samples at 99 % fill the ring
        shed = await s.chat("batch")
        interactive, system = (await s.chat("interactive"))[0], (await s.chat("system"))[0]

        s.exporter.body = exposition(HOT, COOL)  # one candidate has room: batch goes there
        await s.polls(2)
        preferred = [(await s.chat("batch"))[:2] for _ in range(6)]

        # a missed poll keeps the ring: 99, (failed scrape), 99 is saturated
        s.exporter.body = exposition(HOT, HOT)
        s.exporter.status = 503
        s.exporter.script = [
            (200, exposition(COOL, COOL)),
            (200, exposition(HOT, HOT)),
            (503, b"down"),
            (200, exposition(HOT, HOT)),
        ]
        await s.polls(5)
        across_missed = (await s.chat("batch"))[0]

        # then the data goes stale, which empties the ring: one fresh 99 is not saturated yet
        await eventually(lambda: not s.exporter.script, what="the script played")
        await until(lambda: all_stale(s), "both GPUs stale")
        s.exporter.script = [(200, exposition(HOT, HOT))]
        await s.polls(2)
        after_stale = (await s.chat("batch"))[0]
        fresh = await s.gpus()
        shed_count = await s.shed_total("proxy")

    status, headers, body = shed
    assert (429, "GPU_SATURATED") == (status, body["error"]["code"])
    assert {"message", "type", "code"} <= set(body["error"])
    assert int(headers["Retry-After"]) >= 1
    assert (200, 200) == (interactive, system)
    assert [(200, "u1")] * 6 == [(code, h["X-Gateway-Upstream"]) for code, h in preferred]
    assert 429 == across_missed
    assert 200 == after_stale
    assert not any(row["saturated"] or row["stale"] for row in fresh.values())
    assert 2.0 == shed_count


async def all_stale(s: Served) -> bool:
    return all(row["stale"] for row in (await s.gpus()).values())


@e2e
async def test_serve_batch_is_not_shed_from_the_moment_the_data_is_stale(sqlite_dsn: str) -> None:
    """Nothing is shed on stale data. On main the gate read the saturation published at the last
    poll, so from the moment the data went stale until the next poll batch was still refused."""
    hot = exposition(HOT, HOT)
    health = {"shed_batch": True, "sustained_samples": 1, "poll_s": 1.0, "staleness_s": 1.5}
    async with served(sqlite_dsn, hot, **health) as s:
        shed = (await s.chat("batch"))[0]
        s.exporter.status = 503  # polls at +1 s and +2 s fail; the data is stale from +1.5 s
        await until(lambda: all_stale(s), "both GPUs stale")
        fail_open = (await s.chat("batch"))[0]

    assert 429 == shed
    assert 200 == fail_open


# -- the job paths ---------------------------------------------------------------------------

JOB = {"model": "m", "input": {"messages": [{"role": "user", "content": "hi"}]}}


@contextlib.asynccontextmanager
async def shedding(dsn: str, *gpus: Mapping[str, Any]) -> AsyncIterator[Served]:
    """:func:`served` with the external upstream and ``shed_batch``, the GPUs as ``gpus`` for
    two fresh samples (a full ring of ``sustained_samples`` 2)."""
    body = exposition(COOL, COOL)
    async with served(dsn, body, external=True, shed_batch=True, sustained_samples=2) as s:
        s.exporter.body = exposition(*gpus)
        await s.polls(3)
        yield s


@e2e
async def test_serve_a_batch_job_that_may_not_leave_the_building_runs_where_the_gpus_have_room(
    sqlite_dsn: str,
) -> None:
    """u0 (GPU 0) saturated, u1 (GPU 1) not, and an external upstream serves the model too.
    A batch job with ``allow_external: false`` is one candidate short of the external one —
    and must still go to u1. On main u0 was pinned for it before the gate looked: the call was
    shed at the proxy, deferred, and after its attempts the job failed ``CHAIN_EXHAUSTED``."""
    async with shedding(sqlite_dsn, HOT, COOL) as s:
        async with s.http.post(s.url + "/v1/jobs", json={**JOB, "allow_external": False}) as resp:
            created = (resp.status, await resp.json())
        slug = created[1]["slug"]
        final: dict[str, Any] = {}

        async def finished() -> bool:
            async with s.http.get(f"{s.url}/v1/jobs/{slug}") as resp:
                final.update(await resp.json())
            return final["state"] in ("completed", "failed")

        await until(finished, "the job finished")
        async with s.http.get(f"{s.url}/v1/jobs/{slug}/events") as resp:
            events = (await resp.json())["data"]
        hits = {
            name: server.stats.requests["/v1/chat/completions"]
            for name, server in s.servers.items()
        }
        jobs_shed = await s.shed_total("jobs")

    assert 202 == created[0]
    assert "completed" == final["state"], [(e["status"], e["error_code"]) for e in events][-4:]
    assert [] == [e for e in events if e["status"] == "deferred"]
    assert {"s0": 0, "s1": 1, "ext": 0} == hits
    assert 0.0 == jobs_shed


@e2e
async def test_serve_the_sync_front_sheds_a_job_that_may_not_leave_the_building(
    sqlite_dsn: str,
) -> None:
    """Every GPU of ours saturated; only the external upstream has room. A batch job with
    ``allow_external: false`` has no candidate with room: 429 at the front, no job made. One
    that may go external is not shed (the external upstream takes it)."""
    async with shedding(sqlite_dsn, HOT, HOT) as s:
        async with s.http.post(
            s.url + "/v1/jobs?wait=10", json={**JOB, "allow_external": False}
        ) as resp:
            inside = (resp.status, resp.headers.copy(), await resp.json())
        async with s.http.post(s.url + "/v1/jobs?wait=10", json=JOB) as resp:
            anywhere = (resp.status, await resp.json())
        async with s.http.get(s.url + "/v1/jobs") as resp:
            listed = (await resp.json())["data"]
        front_shed = await s.shed_total("sync_front")

        # the job manager: the same job through POST /v1/jobs is deferred, never failed
        async with s.http.post(s.url + "/v1/jobs", json={**JOB, "allow_external": False}) as resp:
            slug = (await resp.json())["slug"]
        trail: list[dict[str, Any]] = []

        async def deferred() -> bool:
            async with s.http.get(f"{s.url}/v1/jobs/{slug}/events") as resp:
                trail[:] = (await resp.json())["data"]
            return any(e["status"] == "deferred" for e in trail)

        await until(deferred, "the job deferred")
        async with s.http.get(f"{s.url}/v1/jobs/{slug}") as resp:
            waiting = (await resp.json())["state"]
        s.exporter.body = exposition(COOL, COOL)
        state: list[str] = []

        async def completed() -> bool:
            async with s.http.get(f"{s.url}/v1/jobs/{slug}") as resp:
                state[:] = [(await resp.json())["state"]]
            return state == ["completed"]

        await until(completed, "the deferred job completed")
        jobs_shed = await s.shed_total("jobs")

    status, headers, body = inside
    assert (429, "GPU_SATURATED") == (status, body["error"]["code"])
    assert int(headers["Retry-After"]) >= 1
    assert (200, "completed") == (anywhere[0], anywhere[1]["state"])
    assert 1 == len(listed), "the shed request made no job"
    assert 1.0 == front_shed
    assert waiting in ("queued", "dispatching"), "a shed job is never failed"
    assert ["GPU_SATURATED"] == [e["error_code"] for e in trail if e["status"] == "deferred"][:1]
    assert jobs_shed >= 1


# -- the XID count window (core) -------------------------------------------------------------


def test_a_fatal_xid_count_that_stays_positive_keeps_the_gpu_faulted_past_fault_hold_s() -> None:
    """A GPU throwing XID 48 once a minute keeps a count of 5 in the exporter's 5-minute window
    (and its sticky last-XID value never changes): it is faulted as long as that lasts. On
    main only a *rising* count was evidence, so the GPU came back after fault_hold_s."""
    limits = thresholds(fault_hold_s=300.0)
    state = fed([(t * 15.0, reading(xid=48, xid_counts={48: 5})) for t in range(41)], limits)

    assert assess(state, 600.0, limits).faulted


def test_an_operator_clear_dismisses_the_counts_it_saw_until_one_rises_above_them() -> None:
    limits = thresholds(fault_hold_s=300.0)
    table = TABLE
    state = fed([(0.0, reading(xid_counts={48: 3}))], limits)
    clear(state, 5.0)
    steps = [(15.0, {48: 3}), (30.0, {48: 2}), (45.0, {48: 2})]
    dismissed = []
    for now, counts in steps:
        observe(state, reading(xid_counts=counts), now, table, limits)
        dismissed.append(assess(state, now, limits).faulted)
    observe(state, reading(xid_counts={48: 3}), 60.0, table, limits)  # a new one in the window

    assert [False, False, False] == dismissed
    assert assess(state, 60.0, limits).faulted
