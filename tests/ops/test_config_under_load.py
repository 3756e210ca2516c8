"""A gateway under load takes config imports with no failed request (issue #7 done-when 4).

A bounded loop of real `openai` chat requests (8 concurrent, ~300 in all, each held ~20 ms by
the fake model server) runs through the proxy while the operator imports two new versions: the
first adds an upstream for the same model and resizes the first one's pool, the second removes
the first upstream entirely while requests are in flight on it. Every request must succeed, and
both upstreams must have served some.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import aiohttp
import openai
from ops_rig import ENV, Admin

from gpugate.fleet import ServerBehaviour
from harness import make_config, model_servers, serving, upstream

REQUESTS = 300
CONCURRENCY = 8


async def test_config_imports_under_load_fail_no_request(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    slow = ServerBehaviour(delay_s=0.02)
    async with model_servers(("s1", ["m"]), ("s2", ["m"]), behaviour=slow) as (s1, s2):
        config = make_config(sqlite_dsn, [upstream("u1", [s1.url], ["m"], max_inflight=4)])
        async with serving(config, environ=ENV) as gw:
            admin = Admin(http, gw.url)
            client = openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
            served: Counter[str] = Counter()
            failures: list[str] = []
            done = 0

            async def worker() -> None:
                nonlocal done
                while done < REQUESTS:
                    done += 1
                    try:
                        raw = await client.chat.completions.with_raw_response.create(
                            model="m", messages=[{"role": "user", "content": "hi"}]
                        )
                        served[raw.headers["x-gateway-upstream"]] += 1
                    except openai.OpenAIError as exc:
                        failures.append(repr(exc))

            async def operator() -> list[int]:
                document = (await admin.export()).body
                both = json.loads(json.dumps(document))
                both["upstreams"][0]["max_inflight"] = 16
                both["upstreams"].append(upstream("u2", [s2.url], ["m"], max_inflight=16))
                while done < REQUESTS // 3:
                    await asyncio.sleep(0.01)
                first = await admin.import_text(json.dumps(both))
                only_u2 = json.loads(json.dumps(both))
                del only_u2["upstreams"][0]
                while done < 2 * REQUESTS // 3:
                    await asyncio.sleep(0.01)
                second = await admin.import_text(json.dumps(only_u2))
                return [first.body["version"], second.body["version"]]

            async with asyncio.timeout(60):
                results = await asyncio.gather(operator(), *(worker() for _ in range(CONCURRENCY)))
            await client.close()
            upstreams = [u.id for u in gw.gateway.registry.upstreams()]
    assert [] == failures
    assert [2, 3] == results[0]
    assert REQUESTS <= sum(served.values())
    assert {"u1", "u2"} == set(served)
    assert ["u2"] == upstreams
