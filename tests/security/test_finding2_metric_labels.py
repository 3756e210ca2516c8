"""Finding 2 (issue #15): a client's ``model`` became a metric label value on refused requests
and on batch lines — 301 requests with random model names took ``/metrics`` from 15 KB to 5 MB,
and RSS up for good. A model no upstream names is now one label value, ``_unknown``, on every
family (read back with Prometheus's own text parser)."""

from __future__ import annotations

import io
import json
import secrets

import aiohttp
import openai
from prometheus_client.parser import text_string_to_metric_families

from facade.test_batches import finished
from gpugate.metrics import UNKNOWN
from harness import RunningGateway, make_config, model_servers, serving, upstream

RANDOM_MODELS = 300


async def label_values(http: aiohttp.ClientSession, gw: RunningGateway) -> tuple[set[str], int]:
    """Every ``model`` label value on ``/metrics``, and the page's size."""
    async with http.get(gw.url + "/metrics") as resp:
        text = await resp.text()
    models = {
        sample.labels["model"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "model" in sample.labels
    }
    return models, len(text)


async def test_finding2_random_model_names_become_one_label_value_and_metrics_stay_small(
    sqlite_dsn: str,
) -> None:
    async with (
        model_servers(("s1", ["m1"])) as servers,
        serving(make_config(sqlite_dsn, [upstream("u1", [servers[0].url], ["m1"])])) as gw,
        aiohttp.ClientSession() as http,
    ):
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        async with http.post(gw.v1 + "/chat/completions", json={"model": "m1", **chat}) as resp:
            assert 200 == resp.status
        _, size_before = await label_values(http, gw)
        statuses = []
        for _ in range(RANDOM_MODELS):
            body = {"model": secrets.token_hex(16), **chat}
            async with http.post(gw.v1 + "/chat/completions", json=body) as resp:
                statuses.append(resp.status)
        models, size_after = await label_values(http, gw)
    assert [404] * RANDOM_MODELS == statuses
    assert {"m1", UNKNOWN} == models
    assert size_after < size_before + 4096  # one more label value's series, not 300


async def test_finding2_batch_lines_naming_unknown_models_become_one_label_value(
    sqlite_dsn: str,
) -> None:
    lines = [
        {
            "custom_id": f"line-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": f"nobody-serves-{n}", "messages": [{"role": "user", "content": "x"}]},
        }
        for n in range(20)
    ]
    data = ("\n".join(json.dumps(line) for line in lines) + "\n").encode()
    async with (
        model_servers(("s1", ["m1"])) as servers,
        serving(make_config(sqlite_dsn, [upstream("u1", [servers[0].url], ["m1"])])) as gw,
        aiohttp.ClientSession() as http,
    ):
        api = openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
        uploaded = await api.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        batch = await api.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = await finished(api, batch.id)
        await api.close()
        models, _ = await label_values(http, gw)
    assert (20, 20) == (done.request_counts.total, done.request_counts.failed)
    assert {UNKNOWN} == models
