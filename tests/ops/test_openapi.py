"""``GET /openapi.json`` is a valid OpenAPI 3.1 document, generated from the models, that lists
every route of the app and of the data plane with its parameters, bodies, answers and security."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from openapi_spec_validator import validate
from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount, Route

from gpugate.web.app import create_app
from gpugate.web.openapi import foreign_operations, walk
from harness import RunningGateway, make_config, serving, upstream

OPERATOR_ROUTES = {
    ("/admin/config", "get"),
    ("/admin/config", "put"),
    ("/admin/config/versions", "get"),
    ("/admin/config/rollback/{version}", "post"),
    ("/admin/runtimes", "get"),
    ("/admin/runtimes/{runtime}", "get"),
    ("/admin/runtimes/{runtime}/enable", "post"),
    ("/admin/runtimes/{runtime}/disable", "post"),
    ("/admin/runtimes/{runtime}/drain", "post"),
    ("/admin/audit", "get"),
    ("/admin/upstreams", "get"),
    ("/admin/gpus", "get"),
    ("/admin/gpus/{gpu}/clear", "post"),
}
DATA_PLANE = {
    ("/v1/chat/completions", "post"),
    ("/v1/completions", "post"),
    ("/v1/embeddings", "post"),
    *(
        ("/u/{upstream_id}/{path}", m)
        for m in ("get", "head", "options", "post", "put", "patch", "delete")
    ),
}
BODIES = {  # operation -> the component its JSON body is, refusing unknown keys
    ("/v1/jobs", "post"): "JobCreate",
    ("/v1/batches", "post"): "BatchCreate",
    ("/admin/runtimes/{runtime}/disable", "post"): "ReasonBody",
    ("/v1/jobs/{slug}", "patch"): "ReportBody",
    ("/v1/jobs/{slug}/fail", "post"): "FailureBody",
    ("/admin/keys", "post"): "KeyCreate",
    ("/admin/keys/{id}", "patch"): "KeyUpdate",
}


@pytest.fixture
async def gw(sqlite_dsn: str) -> AsyncIterator[RunningGateway]:
    config = make_config(sqlite_dsn, [upstream("u", ["http://127.0.0.1:9"], ["m"])])
    async with serving(config) as running:
        yield running


@pytest.fixture
async def schema(gw: RunningGateway, http: aiohttp.ClientSession) -> dict[str, Any]:
    async with http.get(gw.url + "/openapi.json") as resp:
        assert 200 == resp.status
        document: dict[str, Any] = await resp.json()
    return document


def operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            yield path, method, operation


def starlette_routes(routes: list[BaseRoute], prefix: str = "") -> Iterator[tuple[str, str]]:
    """Every (path, method) Starlette serves, as OpenAPI writes a path (no ``:convertor``)."""
    for item in routes:
        if isinstance(item, Mount):
            inner = item.routes or [Route("/{path}", lambda _: None, methods=["GET"])]
            yield from starlette_routes(list(inner), prefix + item.path)
        elif isinstance(item, Route):
            path = re.sub(r"\{(\w+):\w+\}", r"{\1}", prefix + item.path)
            yield from ((path, m.lower()) for m in item.methods or () if m != "HEAD")


def starlette_of(app: Any) -> Starlette:
    """The Starlette app inside the ASGI middleware that wraps it (each keeps it as ``app``)."""
    while not isinstance(app, Starlette):
        app = app.app
    return app


def test_the_document_is_valid_openapi_3_1(schema: dict[str, Any]) -> None:
    validate(schema)  # openapi-spec-validator: raises on any violation of the 3.1 schema

    assert "3.1.0" == schema["openapi"]


def test_every_route_of_the_app_and_of_the_data_plane_is_in_the_document(
    gw: RunningGateway, schema: dict[str, Any]
) -> None:
    app = starlette_of(create_app(gw.gateway))
    served = set(starlette_routes(app.routes)) | DATA_PLANE
    documented = {(path, method) for path, method, _ in operations(schema)}

    assert set() == served - documented
    assert set() == documented - served


def test_every_operation_a_table_declares_is_a_route_the_app_serves(gw: RunningGateway) -> None:
    """A table entry whose route went away would silently drop out of the document."""
    served = {
        (method, path) for method, path, _ in walk(starlette_of(create_app(gw.gateway)).routes)
    }

    assert set() == set(foreign_operations()) - served


def test_every_operation_has_a_summary_answers_and_a_security_requirement(
    schema: dict[str, Any],
) -> None:
    lacking = [
        (path, method)
        for path, method, op in operations(schema)
        if not op.get("summary") or not op.get("responses") or "security" not in op
    ]

    assert [] == lacking


def test_operator_routes_need_the_admin_token_and_worker_routes_a_runtimes_signature_or_secret(
    schema: dict[str, Any],
) -> None:
    security = {(path, method): op["security"] for path, method, op in operations(schema)}

    assert all([{"admin": []}] == security[route] for route in OPERATOR_ROUTES)
    worker = [{"workerSignature": []}, {"worker": []}]
    assert worker == security["/v1/jobs/{slug}/claimed", "post"]
    assert worker == security["/v1/jobs/{slug}", "patch"]
    assert [] == security["/healthz", "get"]


def test_client_routes_take_a_key_as_bearer_api_key_or_x_api_key_when_keys_are_on(
    schema: dict[str, Any],
) -> None:
    schemes = schema["components"]["securitySchemes"]

    assert {"type": "http", "scheme": "bearer"}.items() <= schemes["clientKey"].items()
    assert {"type": "apiKey", "in": "header", "name": "api-key"} == schemes["clientApiKey"]
    assert {"type": "apiKey", "in": "header", "name": "x-api-key"} == schemes["clientXApiKey"]
    expected = [{}, {"clientKey": []}, {"clientApiKey": []}, {"clientXApiKey": []}]
    assert expected == schema["paths"]["/v1/chat/completions"]["post"]["security"]
    assert expected == schema["paths"]["/v1/jobs"]["post"]["security"]


def test_the_data_plane_documents_its_headers_and_its_error_shape(
    schema: dict[str, Any],
) -> None:
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    headers = {p["name"] for p in chat["parameters"] if p["in"] == "header"}
    answer = set(chat["responses"]["200"]["headers"])
    error = chat["responses"]["503"]

    assert {"X-Request-Class", "Idempotency-Key", "X-Request-Id", "X-Session-Id"} == headers
    assert {
        "X-Gateway-Upstream",
        "X-Gateway-Overhead-Ms",
        "X-Gateway-Model",
        "X-Gateway-Attempts",
        "X-Request-Id",
    } == answer
    assert {"Retry-After"} == set(error["headers"])
    assert {"$ref": "#/components/schemas/ErrorBody"} == (
        error["content"]["application/json"]["schema"]
    )
    assert (
        "ChatCompletionRequest"
        in chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    )


def test_every_path_parameter_is_declared_so_every_operation_can_be_fuzzed(
    schema: dict[str, Any],
) -> None:
    undeclared = [
        (path, method, name)
        for path, method, op in operations(schema)
        for name in re.findall(r"\{(\w+)\}", path)
        if name not in {p["name"] for p in op["parameters"] if p["in"] == "path"}
    ]

    assert [] == undeclared


def test_request_bodies_refuse_unknown_keys_as_the_api_promises(
    schema: dict[str, Any],
) -> None:
    components = schema["components"]["schemas"]
    documented = {
        route: schema["paths"][route[0]][route[1]]["requestBody"]["content"]["application/json"][
            "schema"
        ]["$ref"].rsplit("/", 1)[-1]
        for route in BODIES
    }

    assert BODIES == documented
    assert all(components[name]["additionalProperties"] is False for name in BODIES.values())


def test_raw_pass_through_is_documented_for_any_method_and_as_passed_through_unreplayed(
    schema: dict[str, Any],
) -> None:
    """``ANY /u/...`` (DESIGN §3): HEAD and OPTIONS are served and forwarded, so listed; the
    Idempotency-Key goes to the upstream, the gateway replays nothing."""
    raw = schema["paths"]["/u/{upstream_id}/{path}"]

    assert {"get", "head", "options", "post", "put", "patch", "delete"} == set(raw)
    assert "`Idempotency-Key` header goes to the upstream untouched" in raw["head"]["description"]
