"""Tenancy of the Batch API (issue #16, Done-when 3): another tenant gets 404 for a tenant's
files and batches (retrieve, content, cancel, use as input); the owner sees its output file."""

from __future__ import annotations

import asyncio
import io
import json

import aiohttp
import openai
import pytest
from keyed import ENVIRON, create_key, keyed_config

from harness import model_servers, serving

LINES = (
    "\n".join(
        json.dumps(
            {
                "custom_id": f"line-{n}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "m", "messages": [{"role": "user", "content": f"q {n}"}]},
            }
        )
        for n in range(3)
    )
    + "\n"
).encode()


async def test_another_tenant_cannot_see_use_or_cancel_a_tenant_s_files_and_batches(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            a_key = (await create_key(http, gw.url, tenant="team-a"))["key"]
            b_key = (await create_key(http, gw.url, tenant="team-b"))["key"]
            a = openai.AsyncOpenAI(base_url=gw.v1, api_key=a_key, max_retries=0)
            b = openai.AsyncOpenAI(base_url=gw.v1, api_key=b_key, max_retries=0)
            uploaded = await a.files.create(file=("in.jsonl", io.BytesIO(LINES)), purpose="batch")
            refusals = []
            for call in (
                lambda: b.files.retrieve(uploaded.id),
                lambda: b.files.content(uploaded.id),
                lambda: b.batches.create(
                    input_file_id=uploaded.id,
                    endpoint="/v1/chat/completions",
                    completion_window="24h",
                ),
            ):
                with pytest.raises(openai.NotFoundError) as refused:
                    await call()
                refusals.append(refused.value.code)
            batch = await a.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            for call in (lambda: b.batches.retrieve(batch.id), lambda: b.batches.cancel(batch.id)):
                with pytest.raises(openai.NotFoundError) as refused:
                    await call()
                refusals.append(refused.value.code)
            async with asyncio.timeout(60):
                while (done := await a.batches.retrieve(batch.id)).status != "completed":
                    await asyncio.sleep(0.05)
            assert done.output_file_id is not None
            output = await a.files.content(done.output_file_id)
            with pytest.raises(openai.NotFoundError):
                await b.files.content(done.output_file_id)
            await a.close()
            await b.close()
    assert ["FILE_NOT_FOUND"] * 3 + ["BATCH_NOT_FOUND"] * 2 == refusals
    assert 3 == len(output.content.splitlines())


async def test_a_batch_whose_lines_name_a_model_the_key_may_not_use_is_403(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m", "other"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m", "other"])
        async with serving(config, environ=ENVIRON) as gw:
            secret = (await create_key(http, gw.url, models=["other"]))["key"]
            api = openai.AsyncOpenAI(base_url=gw.v1, api_key=secret, max_retries=0)
            uploaded = await api.files.create(file=("in.jsonl", io.BytesIO(LINES)), purpose="batch")
            with pytest.raises(openai.PermissionDeniedError) as refused:
                await api.batches.create(
                    input_file_id=uploaded.id,
                    endpoint="/v1/chat/completions",
                    completion_window="24h",
                )
            await api.close()
    assert "MODEL_NOT_ALLOWED" == refused.value.code
