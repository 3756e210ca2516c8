"""No secret in logs, exports, audit entries or error messages (issue #7, security).

The gateway runs with every kind of secret set in its environment — the admin token, an
upstream's API key, a push worker's secret — while an operator exercises the whole operator
plane (exports, imports valid and invalid, rollbacks, runtime verbs, the audit log, wrong
tokens). Everything a person could read afterwards is scanned for the secret values.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

import aiohttp
from ops_rig import TOKEN, Admin

from harness import make_config, model_servers, serving, upstream

if TYPE_CHECKING:
    import pytest

API_KEY = "sk-upstream-9f8e7d6c5b4a"
WORKER_SECRET = "push-worker-1a2b3c4d5e6f"
SECRETS = (TOKEN, API_KEY, WORKER_SECRET)
ENVIRON = {
    "GPUGATE_ADMIN_TOKEN": TOKEN,
    "UPSTREAM_KEY": API_KEY,
    "HOME1_SECRET": WORKER_SECRET,
}


async def test_no_secret_reaches_logs_exports_audit_or_errors(
    sqlite_dsn: str, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    async with model_servers(("s1", ["m1"])) as (s1,):
        config = make_config(
            sqlite_dsn,
            [upstream("u1", [s1.url], ["m1"], api_key_env="UPSTREAM_KEY")],
            runtimes=[
                {"id": "local", "kind": "upstream"},
                {
                    "id": "home-1",
                    "kind": "push",
                    "models": ["m1"],
                    "push": {"url": "http://127.0.0.1:9/calls", "secret_env": "HOME1_SECRET"},
                },
            ],
            fallback_chain=["local", "home-1"],
        )
        async with serving(config, environ=ENVIRON) as gw:
            admin = Admin(http, gw.url)
            exported = await admin.export()
            replies = [exported, await admin.export(yaml=True)]
            changed = json.loads(exported.text)
            changed["upstreams"][0]["max_inflight"] = 9
            replies.append(await admin.import_text(json.dumps(changed)))
            broken = json.loads(exported.text)
            broken["upstreams"][0]["api_key_env"] = "UNSET_KEY"
            broken["runtimes"][1]["push"]["secret_env"] = "lower-case-is-not-a-name"
            replies.append(await admin.import_text(json.dumps(broken)))
            replies.append(await admin.call("POST", "/admin/config/rollback/1"))
            replies.append(await admin.call("POST", "/admin/runtimes/home-1/disable"))
            replies.append(await admin.call("GET", "/admin/runtimes"))
            replies.append(await admin.call("GET", "/admin/runtimes/home-1"))
            replies.append(await admin.call("GET", "/admin/audit?limit=500"))
            replies.append(await admin.call("GET", "/admin/config/versions"))
            wrong = Admin(http, gw.url, token=TOKEN[:-1] + "x")
            replies.append(await wrong.call("GET", "/admin/runtimes"))
            body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(gw.v1 + "/chat/completions", json=body) as chat:
                seen.append(await chat.text())
            async with http.get(gw.url + "/openapi.json") as schema:
                seen.append(await schema.text())
            audit = await gw.gateway.store.list_audit(limit=500)
            versions = await gw.gateway.store.list_configs()
    seen += [r.text for r in replies]
    seen += [json.dumps([e.detail, e.actor, e.subject]) for e in audit]
    seen += [json.dumps(v.document) for v in versions]
    assert caplog.records  # the logs were captured, so scanning them means something
    seen += [record.getMessage() for record in caplog.records]
    seen += [caplog.text]
    assert 200 == chat.status
    assert (422, 401) == (replies[3].status, replies[-1].status)
    leaks = [(secret, text[:200]) for text in seen for secret in SECRETS if secret in text]
    assert [] == leaks
