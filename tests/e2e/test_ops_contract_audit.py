"""Scale-out and operations read back through the running program (session 15's acceptance
audit of DESIGN §6, §2a's operator keys and §7's operator commands).

Real ``gpugate serve`` processes on one PostgreSQL (or a SQLite file), the real CLI as a
subprocess, one fake model server in the test process. Each test is seconds long: the timings
that matter (``sweep_s: 60``) are set so that only the mechanism under test can pass it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml
from jobs_e2e import CHAT, GatewayProcess, job_requests_served, write_config

from e2e.children import track
from gpugate.fleet import ModelServer
from jobs.conftest import dsn, jobs_postgres, jobs_schema
from ports import free_port

__all__ = ["dsn", "jobs_postgres", "jobs_schema"]

pytestmark = pytest.mark.e2e

TOKEN = "audit-admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
GPUGATE = [sys.executable, "-m", "gpugate"]


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


async def cli(*argv: str, token: str | None = TOKEN, within_s: float = 30) -> Ran:
    """The real ``gpugate`` command, its exit code and output."""
    env = {k: v for k, v in os.environ.items() if k != "GPUGATE_ADMIN_TOKEN"}
    if token is not None:
        env["GPUGATE_ADMIN_TOKEN"] = token
    proc = track(
        await asyncio.create_subprocess_exec(
            *GPUGATE,
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
    )
    out, err = await asyncio.wait_for(proc.communicate(), within_s)
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


async def poll(
    check: Callable[[], Awaitable[bool]], *, within_s: float, every_s: float = 0.1, what: str
) -> None:
    """Await ``check()`` until it is true; fail naming ``what`` after ``within_s``."""
    deadline = time.monotonic() + within_s
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not hold within {within_s} s")
        await asyncio.sleep(every_s)


@pytest.fixture
def admin_token(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GPUGATE_ADMIN_TOKEN", TOKEN)
    return TOKEN


@pytest.fixture
async def fake() -> AsyncIterator[ModelServer]:
    async with ModelServer(["qwen"], name="q0") as server:
        yield server


def gateway(tmp_path: Path, name: str, store: str, upstream_url: str, extra: str) -> GatewayProcess:
    port = free_port()
    config = write_config(
        tmp_path / f"{name}.yaml", port=port, store=store, upstream_url=upstream_url, extra=extra
    )
    return GatewayProcess(config, port, tmp_path / f"{name}.log")


@pytest.fixture
async def replicas(
    tmp_path: Path, jobs_schema: str, fake: ModelServer, admin_token: str
) -> AsyncIterator[tuple[GatewayProcess, GatewayProcess]]:
    """Two replicas on one PostgreSQL schema; a job is found by a sweep only after 60 s, and a
    replica keeps serving for 10 s after a SIGTERM while it drains."""
    del admin_token
    extra = (
        "jobs: {sweep_s: 60}\n"
        "server: {drain_delay_s: 10, shutdown_grace_s: 2, config_poll_s: 0.5}\n"
    )
    a = gateway(tmp_path, "a", jobs_schema, fake.url, extra)
    b = gateway(tmp_path, "b", jobs_schema, fake.url, extra)
    async with aiohttp.ClientSession() as http:
        try:
            await a.start(http)
            await b.start(http)
            yield a, b
        finally:  # kill -9: a SIGTERM would sit out the drain delay
            for replica in (a, b):
                if replica.alive:
                    await replica.kill()


async def job_state(http: aiohttp.ClientSession, url: str, slug: str) -> str:
    async with http.get(f"{url}/v1/jobs/{slug}") as resp:
        return str((await resp.json())["state"]) if resp.status == 200 else f"HTTP {resp.status}"


# -- §6: two replicas on one PostgreSQL ---------------------------------------------------------


@pytest.mark.postgres
async def test_a_job_posted_to_a_draining_replica_is_run_at_once_by_the_other_via_notify(
    replicas: tuple[GatewayProcess, GatewayProcess], http: aiohttp.ClientSession
) -> None:
    """A draining replica takes jobs but claims none: the other one is woken by ``NOTIFY``
    and runs it within seconds (its sweep would find it only after 60 s)."""
    a, b = replicas
    a.terminate()

    async def a_draining() -> bool:
        async with http.get(a.url + "/readyz") as resp:
            return resp.status == 503

    await poll(a_draining, within_s=5, what="A's /readyz 503 after SIGTERM")
    started = time.monotonic()
    body = {"model": "qwen", "input": CHAT, "slug": "via-notify"}
    async with http.post(
        a.url + "/v1/jobs", json=body, headers={"Idempotency-Key": "k-notify"}
    ) as resp:
        assert 202 == resp.status, await resp.text()

    async def done() -> bool:
        return await job_state(http, b.url, "via-notify") == "completed"

    await poll(done, within_s=10, what="the job completed")
    assert time.monotonic() - started < 10
    assert (0, 1) == (
        await job_requests_served(http, a.url),
        await job_requests_served(http, b.url),
    )
    async with http.post(
        b.url + "/v1/jobs", json=body, headers={"Idempotency-Key": "k-notify"}
    ) as again:
        assert (200, "via-notify") == (again.status, (await again.json())["slug"])
    assert 0 == await a.wait(within_s=20)


async def runtime_state(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url + "/admin/runtimes/local", headers=ADMIN) as resp:
        return str((await resp.json())["health"]["state"])


async def set_runtime(
    http: aiohttp.ClientSession, verb: str, a: GatewayProcess, b: GatewayProcess
) -> None:
    """``verb`` the runtime ``local`` on A, and wait until both replicas have it in effect."""
    async with http.post(f"{a.url}/admin/runtimes/local/{verb}", headers=ADMIN) as resp:
        assert 200 == resp.status

    async def both() -> bool:
        return {await runtime_state(http, a.url), await runtime_state(http, b.url)} == {f"{verb}d"}

    await poll(both, within_s=5, what=f"both replicas see local {verb}d")


@pytest.mark.postgres
async def test_a_job_retried_on_a_draining_replica_is_run_at_once_by_the_other(
    replicas: tuple[GatewayProcess, GatewayProcess], http: aiohttp.ClientSession
) -> None:
    """``POST /v1/jobs/{slug}/retry`` re-queues a failed job and wakes every replica, as a new
    job does: before, it woke only the replica it was sent to, so sent to a draining one the
    job waited for another's sweep (60 s here)."""
    a, b = replicas
    await set_runtime(http, "disable", a, b)
    async with http.post(a.url + "/v1/jobs", json={"model": "qwen", "input": CHAT}) as resp:
        slug = (await resp.json())["slug"]

    async def failed() -> bool:
        return await job_state(http, a.url, slug) == "failed"

    await poll(failed, within_s=5, what="the job failed: its only runtime disabled")
    await set_runtime(http, "enable", a, b)
    a.terminate()

    async def a_draining() -> bool:
        async with http.get(a.url + "/readyz") as resp:
            return resp.status == 503

    await poll(a_draining, within_s=5, what="A's /readyz 503 after SIGTERM")
    async with http.post(f"{a.url}/v1/jobs/{slug}/retry") as resp:
        assert (200, "queued") == (resp.status, (await resp.json())["state"])

    async def completed() -> bool:
        return await job_state(http, b.url, slug) == "completed"

    await poll(completed, within_s=8, what="the retried job completed")
    assert 1 == await job_requests_served(http, b.url)


@pytest.mark.postgres
async def test_a_sync_idempotency_key_used_on_one_replica_is_replayed_by_the_other(
    replicas: tuple[GatewayProcess, GatewayProcess], http: aiohttp.ClientSession, fake: ModelServer
) -> None:
    a, b = replicas
    body = {"model": "qwen", "messages": [{"role": "user", "content": "once"}]}
    key = {"Idempotency-Key": "sync-key-1"}
    async with http.post(a.url + "/v1/chat/completions", json=body, headers=key) as first:
        assert 200 == first.status
        original = await first.read()
    async with http.post(b.url + "/v1/chat/completions", json=body, headers=key) as replay:
        assert 200 == replay.status
        assert "true" == replay.headers.get("Idempotent-Replayed")
        assert original == await replay.read()
    other = {**body, "messages": [{"role": "user", "content": "another"}]}
    async with http.post(b.url + "/v1/chat/completions", json=other, headers=key) as reused:
        assert (422, "IDEMPOTENCY_KEY_REUSED") == (
            reused.status,
            (await reused.json())["error"]["code"],
        )
    assert 1 == fake.stats.requests.get("/v1/chat/completions", 0)


@pytest.mark.postgres
async def test_admin_actions_through_the_cli_on_one_replica_hold_on_the_other(
    replicas: tuple[GatewayProcess, GatewayProcess], http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    a, b = replicas
    disabled = await cli("runtimes", "disable", "local", "--gateway", a.url, "--reason", "audit")
    assert (0, "") == (disabled.code, disabled.err), disabled

    async def b_sees(state: str) -> bool:
        async with http.get(b.url + "/admin/runtimes/local", headers=ADMIN) as resp:
            return bool((await resp.json())["health"]["state"] == state)

    await poll(lambda: b_sees("disabled"), within_s=5, what="B sees local disabled")
    async with http.post(b.url + "/v1/jobs", json={"model": "qwen", "input": CHAT}) as resp:
        assert 202 == resp.status
        refused = (await resp.json())["slug"]

    async def refused_failed() -> bool:
        return await job_state(http, a.url, refused) == "failed"

    await poll(refused_failed, within_s=5, what="B's job failed: its only runtime disabled")
    async with http.get(f"{a.url}/v1/jobs/{refused}") as resp:
        error = (await resp.json())["error"]
    assert "CHAIN_EXHAUSTED" == error["code"]
    assert "disabled" in error["message"]
    enabled = await cli("runtimes", "enable", "local", "--gateway", b.url)
    assert 0 == enabled.code, enabled
    await poll(lambda: b_sees("enabled"), within_s=5, what="B sees local enabled")

    async def a_sees_enabled() -> bool:
        async with http.get(a.url + "/admin/runtimes/local", headers=ADMIN) as resp:
            return bool((await resp.json())["health"]["state"] == "enabled")

    await poll(a_sees_enabled, within_s=5, what="A sees local enabled again")

    exported = await cli("config", "export", "--gateway", a.url, "-o", str(tmp_path / "g.yaml"))
    assert 0 == exported.code, exported
    document = yaml.safe_load((tmp_path / "g.yaml").read_text())
    document["upstreams"][0]["max_inflight"] = 9
    (tmp_path / "g2.yaml").write_text(yaml.safe_dump(document))
    imported = await cli("config", "import", str(tmp_path / "g2.yaml"), "--gateway", a.url)
    assert (0, "gateway config version 2 (a new version)") == (imported.code, imported.out.strip())

    async def b_follows() -> bool:  # in effect on B, not only stored
        async with http.get(b.url + "/admin/config/versions", headers=ADMIN) as resp:
            versions = (await resp.json())["versions"]
        return [2] == [v["version"] for v in versions if v["current"]]

    await poll(b_follows, within_s=5, what="B has version 2 in effect")
    versions = await cli("config", "versions", "--gateway", b.url)
    assert ["*", "2"] == versions.out.split()[:2], versions
    rolled = await cli("config", "rollback", "1", "--gateway", b.url)
    assert "gateway config version 3 = version 1" == rolled.out.strip(), rolled


async def in_effect(http: aiohttp.ClientSession, url: str) -> list[tuple[int, str]]:
    """The versions a replica lists, newest first, and the one in effect there marked ``*``."""
    async with http.get(url + "/admin/config/versions", headers=ADMIN) as resp:
        versions = (await resp.json())["versions"]
    return [(v["version"], ("*" if v["current"] else "") + v["actor"]) for v in versions]


@pytest.mark.postgres
@pytest.mark.parametrize("source", ["file", "store"])
async def test_config_source_decides_what_an_edited_file_does_at_a_replicas_restart(
    tmp_path: Path,
    jobs_schema: str,
    fake: ModelServer,
    admin_token: str,
    http: aiohttp.ClientSession,
    source: str,
) -> None:
    """§2a: with ``file`` the edited file of the restarted replica becomes the next version,
    which the other replica follows; with ``store`` the store's version stays in effect."""
    del admin_token
    extra = f"config_source: {source}\nserver: {{config_poll_s: 0.5}}\n"
    a = gateway(tmp_path, "a", jobs_schema, fake.url, extra)
    b = gateway(tmp_path, "b", jobs_schema, fake.url, extra)
    await a.start(http)
    await b.start(http)
    try:
        await b.stop()
        edited = b.config.read_text().replace(
            "models: [qwen]\n", "models: [qwen]\n    max_inflight: 7\n"
        )
        b.config.write_text(edited)
        await b.start(http)
        expected = [(2, "*file"), (1, "config-file")] if source == "file" else [(1, "*config-file")]

        async def a_follows() -> bool:
            return await in_effect(http, a.url) == expected

        await poll(a_follows, within_s=5, what=f"A has {expected} in effect")
        on_b = await in_effect(http, b.url)
        async with http.get(a.url + "/admin/upstreams", headers=ADMIN) as resp:
            text = await resp.text()
    finally:
        await a.stop()
        await b.stop()
    assert expected == on_b
    assert ('"max_inflight":7' in text.replace(" ", "")) is (source == "file")
    if source == "store":
        assert "the store's version is in effect (config_source: store)" in b.log.read_text()


async def test_the_operator_commands_without_the_admin_token_are_one_line_and_exit_1(
    tmp_path: Path,
    sqlite_dsn: str,
    fake: ModelServer,
    admin_token: str,
    http: aiohttp.ClientSession,
) -> None:
    del admin_token
    gw = gateway(tmp_path, "gw", sqlite_dsn, fake.url, "")
    await gw.start(http)
    try:
        answers = [
            await cli(*argv, "--gateway", gw.url, token=None)
            for argv in (("runtimes", "list"), ("config", "versions"))
        ]
        wrong = await cli("runtimes", "list", "--gateway", gw.url, token="not-the-token")
        unknown = await cli("runtimes", "drain", "nope", "--gateway", gw.url)
        listed = await cli("runtimes", "list", "--gateway", gw.url)
    finally:
        await gw.stop()
    for ran in [*answers, wrong, unknown]:
        assert (1, "") == (ran.code, ran.out), ran
        assert 1 == len(ran.err.strip().splitlines()), ran
        assert ran.err.startswith("gpugate: error: "), ran
        assert "Traceback" not in ran.err
    assert all("GPUGATE_ADMIN_TOKEN" in ran.err for ran in answers), answers
    assert "401" in wrong.err
    assert "404 UNKNOWN_RUNTIME" in unknown.err
    assert (0, "local") == (listed.code, listed.out.split()[0])


# -- §2a retention, through the running program, both backends -------------------------------


async def test_retention_purges_finished_jobs_and_audit_rows_and_never_an_unfinished_job(
    tmp_path: Path, dsn: str, fake: ModelServer, admin_token: str, http: aiohttp.ClientSession
) -> None:
    del admin_token
    extra = (
        "retention: {jobs_s: 1, audit_s: 1, batches_s: 1, every_s: 0.5}\n"
        "server: {shutdown_grace_s: 1}\n"
    )
    gw = gateway(tmp_path, "gw", dsn, fake.url, extra)
    await gw.start(http)
    try:
        async with http.post(gw.url + "/v1/jobs", json={"model": "qwen", "input": CHAT}) as r:
            done_slug = (await r.json())["slug"]

        async def completed() -> bool:
            return await job_state(http, gw.url, done_slug) == "completed"

        await poll(completed, within_s=10, what="the first job completed")
        fake.update(hang=True)  # the next job's call is held: it stays running
        async with http.post(gw.url + "/v1/jobs", json={"model": "qwen", "input": CHAT}) as r:
            running_slug = (await r.json())["slug"]

        async def running() -> bool:
            return await job_state(http, gw.url, running_slug) == "running"

        await poll(running, within_s=10, what="the second job running")
        async with http.post(gw.url + "/admin/runtimes/local/disable", headers=ADMIN) as r:
            assert 200 == r.status  # an audit row; the call in flight goes on

        async def purged() -> bool:
            return await job_state(http, gw.url, done_slug) == "HTTP 404"

        await poll(purged, within_s=10, what="the finished job purged")

        async def audit_empty() -> bool:
            async with http.get(gw.url + "/admin/audit", headers=ADMIN) as resp:
                return not (await resp.json())["data"]

        await poll(audit_empty, within_s=10, what="the audit rows purged")
        await asyncio.sleep(1.5)  # three more passes, the running job well past jobs_s
        assert "running" == await job_state(http, gw.url, running_slug)
        async with http.get(gw.url + "/metrics") as resp:
            metrics = await resp.text()
        fake.update(hang=False)
    finally:
        await gw.stop()
    assert 'gateway_retention_purged_total{kind="jobs"} 1.0' in metrics


def test_a_retention_of_zero_is_refused_at_load_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpugate.cli import main

    path = tmp_path / "g.yaml"
    path.write_text(
        "upstreams: [{id: u, url: 'http://127.0.0.1:9', models: [m]}]\nretention: {jobs_s: 0}\n"
    )
    assert 1 == main(["check-config", str(path)])
    assert (
        "retention.jobs_s: expected a number greater than 0, got 0 (line 2)\n"
        == capsys.readouterr().out
    )


# -- §7 db upgrade, through the real command, both backends ----------------------------------


async def test_db_upgrade_migrates_a_fresh_store_then_finds_it_up_to_date(dsn: str) -> None:
    fresh = await cli("db", "upgrade", "--store", dsn)
    again = await cli("db", "upgrade", "--store", dsn)
    assert (0, "") == (fresh.code, fresh.err), fresh
    assert fresh.out.startswith("applied: 0001_initial, ")
    assert "0016_lease_columns" in fresh.out
    assert (0, "the store is up to date\n", "") == (again.code, again.out, again.err)


@pytest.mark.parametrize(
    "store",
    [
        "postgresql://gpugate:hunter2@127.0.0.1:1/nothing",
        "sqlite:////proc/no/such/dir/g.db",
        "mysql://somewhere/db",
    ],
)
async def test_db_upgrade_that_cannot_reach_its_store_is_one_line_without_its_password(
    store: str,
) -> None:
    ran = await cli("db", "upgrade", "--store", store)
    assert (1, "") == (ran.code, ran.out), ran
    assert 1 == len(ran.err.strip().splitlines()), ran
    assert ran.err.startswith("gpugate: error: ")
    assert "hunter2" not in ran.err


# -- §2a admin_listen and tls, through `gpugate serve` ----------------------------------------


async def status_of(http: aiohttp.ClientSession, url: str) -> tuple[int, str | None]:
    async with http.get(url, headers=ADMIN) as resp:
        body = await resp.json() if resp.content_type == "application/json" else {}
        error = body.get("error") if isinstance(body, dict) else None
        return resp.status, (error or {}).get("code")


async def test_admin_listen_over_mtls_serves_the_operator_plane_there_and_only_there(
    tmp_path: Path, sqlite_dsn: str, fake: ModelServer, admin_token: str
) -> None:
    del admin_token
    from security.tls_rig import make_pki

    pki = make_pki(tmp_path)
    admin_port = free_port()
    extra = (
        f"admin_listen: 127.0.0.1:{admin_port}\n"
        f"tls: {{cert_file: {pki.server_pem}, key_file: {pki.server_pem}, "
        f"client_ca_file: {pki.ca_file}}}\n"
    )
    gw = gateway(tmp_path, "gw", sqlite_dsn, fake.url, extra)
    gw.url = gw.url.replace("http://", "https://")
    admin = f"https://127.0.0.1:{admin_port}"
    with_cert = aiohttp.TCPConnector(ssl=pki.client_context(pki.client_pem))
    async with aiohttp.ClientSession(connector=with_cert) as http:
        await gw.start(http)
        try:
            main = {p: await status_of(http, gw.url + p) for p in MAIN_PATHS}
            on_admin = {p: await status_of(http, admin + p) for p in MAIN_PATHS}
            no_cert = aiohttp.TCPConnector(ssl=pki.client_context())
            async with aiohttp.ClientSession(connector=no_cert) as anonymous:
                for url in (gw.url + "/healthz", admin + "/admin/upstreams"):
                    with pytest.raises(aiohttp.ClientError):
                        await status_of(anonymous, url)
            async with aiohttp.ClientSession() as plain:
                with pytest.raises(aiohttp.ClientError):
                    await status_of(plain, admin.replace("https", "http") + "/admin/upstreams")
        finally:
            await gw.stop()
    not_here = (404, "NOT_FOUND")
    assert {
        "/healthz": (200, None),
        "/readyz": (200, None),
        "/metrics": (200, None),
        "/v1/models": (200, None),
        "/admin/upstreams": not_here,
        "/console": not_here,
    } == main
    assert {
        "/healthz": not_here,
        "/readyz": not_here,
        "/metrics": not_here,
        "/v1/models": not_here,
        "/admin/upstreams": (200, None),
        "/console": (200, None),
    } == on_admin


MAIN_PATHS = ("/healthz", "/readyz", "/metrics", "/v1/models", "/admin/upstreams", "/console")
