"""Finding 6 (issue #15): one secret authenticated both directions of the push protocol and rode
in cleartext as a bearer token with the lease token, and the reaper believed whatever answered a
worker's ``GET /calls/{id}``.

Every message is now HMAC-signed (method, path, lease token, body digest, timestamp, nonce) with
a key per direction derived from the runtime's secret, which never travels; the receiver refuses
a replay (nonce cache, time window) and a message signed for the other direction; every answer
is signed for the request it answers. ``push.auth: bearer`` keeps a wave-1 worker working.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import aiohttp
import pytest
from fake_worker_signing import forged_worker
from tls_rig import Pki, make_pki, serving_as_serve_does

from gpugate import push_signature
from gpugate.adapters.push_client import PushClient
from gpugate.clock import SystemClock
from gpugate.core.push_keys import PushKeys
from gpugate.errors import RuntimeAuthFailed, Unauthorized
from gpugate.fleet import ModelServer
from gpugate.services.runtimes.push import PushRuntime
from gpugate.worker import WorkerSettings
from gpugate.worker.server import running_worker
from harness import eventually, make_config
from ports import free_port
from push.fake_worker import FakeWorker
from push.push_rig import (
    CHAT,
    SECRETS,
    held_gateway,
    leased,
    push_config,
    signed,
    until_state,
)

SECRET = SECRETS["HOME1_SECRET"]
W2G, G2W = push_signature.WORKER_TO_GATEWAY, push_signature.GATEWAY_TO_WORKER
REPORT = {"method": "PATCH", "target": "/v1/jobs/j1", "lease_token": "tok"}


def sign(direction: str, body: bytes = b'{"result": 1}', **changes: object) -> str:
    parts = {**REPORT, "body": body, "now": time.time(), **changes}
    return push_signature.sign_request(
        push_signature.derive_key(SECRET, direction),
        direction,
        **parts,  # type: ignore[arg-type]
    )


def keys() -> PushKeys:
    push_keys = PushKeys()
    push_keys.set("home-1", SECRET, auth="signed")
    return push_keys


def accepts(
    push_keys: PushKeys, signature: str, body: bytes = b'{"result": 1}', **changes: object
) -> bool:
    parts = {**REPORT, "body": body, **changes}
    try:
        push_keys.authenticate(signature, None, now=time.time(), **parts)  # type: ignore[arg-type]
    except Unauthorized:
        return False
    return True


def test_finding6_a_report_is_taken_once_and_only_as_signed() -> None:
    push_keys = keys()
    good = sign(W2G)
    assert accepts(push_keys, good)
    assert not accepts(push_keys, good)  # the same request again: a replay
    assert not accepts(push_keys, sign(W2G), body=b'{"result": 2}')  # another body
    assert not accepts(push_keys, sign(W2G), target="/v1/jobs/j2")  # another job
    assert not accepts(push_keys, sign(W2G), lease_token="another")  # another lease
    assert not accepts(push_keys, sign(W2G, now=time.time() - 400))  # outside the window
    assert not accepts(push_keys, sign(G2W))  # the gateway's own key: no reflection


def test_finding6_a_signed_runtimes_secret_is_refused_as_a_bearer_token() -> None:
    with pytest.raises(Unauthorized):
        keys().authenticate(None, f"Bearer {SECRET}", now=time.time(), body=b"", **REPORT)


def test_a_bearer_runtime_is_known_by_its_secret_and_only_that_one() -> None:
    push_keys = keys()
    push_keys.set("old-worker", "wave-1-secret", auth="bearer")
    runtimes, nonce = push_keys.authenticate(
        None, "Bearer wave-1-secret", now=time.time(), body=b"", **REPORT
    )
    assert ({"old-worker"}, None) == (runtimes, nonce)


def test_finding6_the_nonce_cache_is_bounded_and_eviction_never_reopens_a_replay() -> None:
    cache = push_signature.NonceCache(window_s=300, max_entries=2)
    first, second, third = (push_signature.Signed(1000 + n, f"n{n}") for n in range(3))
    assert [True, True, True] == [cache.admit(s, 1002) for s in (first, second, third)]
    assert 2 == len(cache)
    assert not cache.admit(first, 1002)  # evicted, but below the floor: still refused


async def test_finding6_the_gateway_sends_no_secret_and_trusts_no_unsigned_answer() -> None:
    async with FakeWorker(secret=SECRET) as honest, forged_worker() as forger:
        client = PushClient()
        await client.start()
        try:
            clock = SystemClock()
            real = PushRuntime("home-1", honest.url, SECRET, client, clock, gateway_url="u")
            fake = PushRuntime("home-1", forger.url, SECRET, client, clock, gateway_url="u")
            honest.statuses["call-1"] = {"state": "completed", "result": {"text": "real"}}
            believed = await real.status("call-1")
            with pytest.raises(RuntimeAuthFailed):
                await fake.status("call-1")  # a forged "completed" from whoever listens there
        finally:
            await client.close()
    [sent] = honest.received
    assert ("completed", {"text": "real"}) == (believed.state, believed.result)
    assert sent.authorization is None
    assert sent.signature is not None
    assert SECRET not in json.dumps([sent.signature, sent.body])


async def test_finding6_the_worker_refuses_an_unsigned_or_replayed_push(
    sqlite_dsn: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    port = free_port()
    async with ModelServer(["qwen"], name="q0") as fake, held_gateway(sqlite_dsn, fake.url) as gw:
        settings = WorkerSettings("home-1", SECRET, gw.url, fake.url, tmp_path / "o")
        async with running_worker(settings, "127.0.0.1", port) as running:
            job = await leased(gw.gateway.store, "j1")
            url = f"{running.url}/calls"
            body = json.dumps({"slug": "j1", "model": "qwen", "operation": "chat/completions",
                               "input": CHAT, "lease_token": job.lease_token}).encode()  # fmt: skip
            bearer = {"Authorization": f"Bearer {SECRET}", "Content-Type": "application/json"}
            async with http.post(url, data=body, headers=bearer) as resp:
                unsigned = resp.status
            headers = signed(SECRET, G2W, "POST", url, body)
            async with http.post(url, data=body, headers=headers) as resp:
                accepted = (resp.status, resp.headers.get(push_signature.HEADER) is not None)
            async with http.post(url, data=body, headers=headers) as resp:
                replayed = resp.status
            await until_state(gw.gateway.store, "j1", "completed")
    assert (401, (202, True), 401) == (unsigned, accepted, replayed)


async def test_finding6_a_job_runs_through_a_worker_over_mutual_tls_and_signed_messages(
    sqlite_dsn: str, tmp_path: Path
) -> None:
    pki: Pki = make_pki(tmp_path)
    port = free_port()
    async with ModelServer(["qwen"], name="q0") as fake:
        config = push_config(sqlite_dsn, fake.url, urls=(f"https://127.0.0.1:{port}/calls",) * 2)
        document = config.model_dump(mode="json")
        document["runtimes"][0]["push"]["ca_file"] = str(pki.ca_file)
        document["tls"] = pki.tls_block(mtls=True)
        tls_config = make_config(document.pop("store"), document.pop("upstreams"), **document)
        async with serving_as_serve_does(tls_config, environ=SECRETS) as gw:
            settings = WorkerSettings(
                "home-1", SECRET, gw.url, fake.url, tmp_path / "o",
                tls_cert_file=pki.server_pem, tls_key_file=pki.server_pem,
                tls_client_ca_file=pki.ca_file, gateway_ca_file=pki.ca_file,
            )  # fmt: skip
            async with running_worker(settings, "127.0.0.1", port) as running:
                body = {"model": "qwen", "input": {"messages": [{"role": "user", "content": "x"}]}}
                async with aiohttp.ClientSession() as http:
                    async with http.post(
                        gw.url + "/v1/jobs",
                        json={**body, "runner": "home-1", "slug": "over-tls"},
                        ssl=pki.client_context(pki.client_pem),
                    ) as resp:
                        assert 202 == resp.status
                done = await until_state(gw.gateway.store, "over-tls", "completed", within_s=20)
                events = await gw.gateway.store.job_events("over-tls")
                worker = running.worker
                await eventually(lambda: worker.completed == 1, what="the worker saw it taken")
    assert running.url.startswith("https://")
    assert "chat.completion" == done.result["object"]
    assert "worker:home-1" == events[-1].actor


def test_the_key_hint_picks_the_one_key_to_try_and_cannot_lend_another_runtimes() -> None:
    push_keys = keys()
    push_keys.set("home-2", "secret-of-home-2", auth="signed")
    assert accepts(push_keys, sign(W2G, key_id="home-1"))
    assert accepts(push_keys, sign(W2G, key_id="no-such-runtime"))  # unknown: every key tried
    assert not accepts(push_keys, sign(W2G, key_id="home-2"))  # home-1's MAC, home-2's hint
