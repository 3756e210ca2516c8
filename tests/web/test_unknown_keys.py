"""Every JSON request body of the app refuses a key it does not know, with a 400 naming it —
found from the routes themselves, so a route added tomorrow is held to it without a list."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from pydantic import BaseModel
from starlette.applications import Starlette
from yarl import URL

from gpugate import push_signature
from gpugate.web.api import spec_of
from gpugate.web.app import create_app
from gpugate.web.openapi import walk
from gpugate.web.schemas.operation import Security, Spec
from harness import RunningGateway, make_config, serving, upstream

ADMIN_TOKEN = "admin-token"
WORKER_SECRET = "secret-of-home-1"
# What the API promises (docs/api.md, decisions §12): if one of these stopped taking a JSON
# model, the walk below would silently test less.
PROMISED = {
    ("post", "/v1/jobs"),
    ("post", "/v1/batches"),
    ("post", "/admin/keys"),
    ("patch", "/admin/keys/{id}"),
    ("post", "/admin/runtimes/{runtime}/enable"),
    ("post", "/admin/runtimes/{runtime}/disable"),
    ("post", "/admin/runtimes/{runtime}/drain"),
    ("patch", "/v1/jobs/{slug}"),
    ("post", "/v1/jobs/{slug}/fail"),
}


@pytest.fixture
async def gw(sqlite_dsn: str) -> AsyncIterator[RunningGateway]:
    config = make_config(
        sqlite_dsn,
        [upstream("u", ["http://127.0.0.1:9"], ["m"])],
        runtimes=[
            {
                "id": "home-1",
                "kind": "push",
                "models": ["m"],
                "push": {"url": "http://127.0.0.1:9/calls", "secret_env": "HOME1_SECRET"},
            },
            {"id": "local", "kind": "upstream"},
        ],
        fallback_chain=["home-1", "local"],
        default_runtime="home-1",
    )
    environ = {"GPUGATE_ADMIN_TOKEN": ADMIN_TOKEN, "HOME1_SECRET": WORKER_SECRET}
    async with serving(config, environ=environ, run_job_loops=False) as running:
        yield running


def starlette_of(app: Any) -> Starlette:
    while not isinstance(app, Starlette):
        app = app.app
    return app


def json_body_operations(gw: RunningGateway) -> dict[tuple[str, str], Spec]:
    """Every operation of the app whose body is one JSON model."""
    found = {}
    for method, path, route in walk(starlette_of(create_app(gw.gateway)).routes):
        spec = spec_of(route) if hasattr(route, "endpoint") else None
        if spec is not None and isinstance(spec.body, type) and issubclass(spec.body, BaseModel):
            found[method, path] = spec
    return found


def credentials(spec: Spec, method: str, url: str, data: bytes) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if spec.security is Security.ADMIN:
        headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
    elif spec.security is Security.WORKER:
        key = push_signature.derive_key(WORKER_SECRET, push_signature.WORKER_TO_GATEWAY)
        headers["X-Lease-Token"] = "a-token"
        headers[push_signature.HEADER] = push_signature.sign_request(
            key,
            push_signature.WORKER_TO_GATEWAY,
            method=method,
            target=URL(url).raw_path_qs,
            body=data,
            lease_token="a-token",
            now=time.time(),
        )
    return headers


async def test_every_json_body_refuses_an_unknown_key_naming_it_and_the_allowed_ones(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    operations = json_body_operations(gw)
    data = json.dumps({"surprise": 1}).encode()
    answers = {}
    for (method, path), spec in operations.items():
        url = gw.url + re.sub(r"\{\w+\}", "x", path)
        headers = credentials(spec, method.upper(), url, data)
        async with http.request(method, url, data=data, headers=headers) as resp:
            answers[method, path] = resp.status, (await resp.json())["error"]

    assert set() == PROMISED - set(operations)
    refused = {
        op: (status, error["code"], "surprise: unknown key (allowed: " in error["message"])
        for op, (status, error) in answers.items()
    }
    assert dict.fromkeys(operations, (400, "BAD_REQUEST", True)) == refused
