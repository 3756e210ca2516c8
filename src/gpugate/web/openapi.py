"""``GET /openapi.json``: the OpenAPI 3.1 document of every route, generated from the models.

Each operation comes from where its route is served:

* a Starlette route declared with :func:`gpugate.web.api.operation` — its :class:`Spec`;
* a Starlette route of a module that declares no spec yet (the console's pages and forms) —
  :data:`gpugate.web.schemas.console.OPERATIONS`;
* the data plane, served by raw ASGI before Starlette — :mod:`gpugate.web.schemas.dataplane`.

Bodies and parameters are the pydantic models' JSON Schemas (requests as validated, responses
as serialized), under ``components/schemas``; every error is :class:`ErrorBody`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route

from gpugate import __version__
from gpugate.web.api import operation, route, spec_of
from gpugate.web.schemas import console, dataplane
from gpugate.web.schemas.common import ErrorBody
from gpugate.web.schemas.operation import Answer, Operation, RawBody, Security, Spec

SCHEMES: dict[str, dict[str, str]] = {
    "admin": {
        "type": "http",
        "scheme": "bearer",
        "description": "the admin token (the variable named by admin_token_env)",
    },
    "worker": {
        "type": "http",
        "scheme": "bearer",
        "description": "push.auth bearer: the secret of the push runtime holding the job's lease",
    },
    "workerSignature": {
        "type": "apiKey",
        "in": "header",
        "name": "X-Gpugate-Signature",
        "description": "push.auth signed (the default): the request signed with the runtime's key",
    },
    "clientKey": {
        "type": "http",
        "scheme": "bearer",
        "description": "auth.mode keys: a client key (none needed with auth.mode open)",
    },
    "clientApiKey": {"type": "apiKey", "in": "header", "name": "api-key"},
    "clientXApiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
    "consoleSession": {"type": "apiKey", "in": "cookie", "name": "gpugate_console"},
}
SECURITY: dict[Security, list[dict[str, list[str]]]] = {
    Security.NONE: [],
    Security.CLIENT: [{}, {"clientKey": []}, {"clientApiKey": []}, {"clientXApiKey": []}],
    Security.ADMIN: [{"admin": []}],
    Security.WORKER: [{"workerSignature": []}, {"worker": []}],
    Security.CONSOLE: [{"consoleSession": []}],
}
PAGE = {"type": "string", "description": "an HTML page saying what went wrong"}
RETRY_AFTER = {"description": "seconds to wait before trying again", "schema": {"type": "integer"}}
_CONVERTOR = re.compile(r"\{(\w+):\w+\}")
_REF = "#/components/schemas/{model}"

Keyed = tuple[type[BaseModel], JsonSchemaMode]


def foreign_operations() -> dict[tuple[str, str], Spec]:
    """The specs of routes whose modules declare none, by (method, path)."""
    return {(op.method, op.path): op.spec for op in console.OPERATIONS}


def walk(routes: Sequence[BaseRoute], prefix: str = "") -> Iterator[tuple[str, str, BaseRoute]]:
    """Every (method, OpenAPI path, route) of ``routes``, into mounts; HEAD goes with GET."""
    for item in routes:
        if isinstance(item, Route):
            for method in sorted((item.methods or set()) - {"HEAD"}):
                yield method.lower(), _CONVERTOR.sub(r"{\1}", prefix + item.path), item
        elif isinstance(item, Mount):
            if item.routes:
                yield from walk(item.routes, prefix + item.path)
            else:  # an ASGI app under the prefix: static files
                yield "get", prefix + item.path + "/{path}", item


def operations(routes: Sequence[BaseRoute]) -> list[Operation]:
    """Every documented operation of an app with ``routes``, plus the data plane's."""
    foreign = foreign_operations()
    found = []
    for method, path, item in walk(routes):
        spec = spec_of(item) if isinstance(item, Route) else None
        spec = spec or foreign.get((method, path))
        if spec is not None:
            found.append(Operation(method, path, spec))
    return [*found, *dataplane.OPERATIONS]


def document(ops: Sequence[Operation]) -> dict[str, Any]:
    """The OpenAPI document of ``ops``."""
    keyed = _models(ops)
    refs, definitions = models_json_schema(keyed, ref_template=_REF)
    components: dict[str, Any] = dict(definitions.get("$defs", {}))
    render = _Renderer(refs, components)
    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        paths.setdefault(op.path, {})[op.method] = render.operation(op)
    for name in render.parameter_models:
        components.pop(name, None)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "gpugate",
            "version": __version__,
            "description": "A GPU-health-aware OpenAI-compatible gateway with durable jobs.",
        },
        "paths": paths,
        "components": {"schemas": components, "securitySchemes": SCHEMES},
    }


def _models(ops: Sequence[Operation]) -> list[Keyed]:
    keyed: dict[Keyed, None] = {(ErrorBody, "serialization"): None}
    for op in ops:
        spec = op.spec
        for part in (spec.path, spec.query, spec.headers):
            if part is not None:
                keyed[part, "validation"] = None
        for model in _body_models(spec):
            keyed[model, "validation"] = None
        for answer in spec.responses.values():
            if answer.model is not None:
                keyed[answer.model, answer.mode] = None
    return list(keyed)


def _body_models(spec: Spec) -> list[type[BaseModel]]:
    if isinstance(spec.body, RawBody):
        return [m for m in spec.body.media.values() if isinstance(m, type)]
    return [] if spec.body is None else [spec.body]


class _Renderer:
    """Writes operations against one set of component schemas."""

    def __init__(self, refs: dict[Any, Any], components: dict[str, Any]) -> None:
        self.refs = refs
        self.components = components
        self.parameter_models: set[str] = set()

    def operation(self, op: Operation) -> dict[str, Any]:
        spec = op.spec
        rendered: dict[str, Any] = {
            "operationId": _operation_id(op),
            "summary": spec.summary,
            "tags": list(spec.tags),
            "security": SECURITY[spec.security],
            "parameters": [
                *self.parameters(spec.path, "path"),
                *self.parameters(spec.query, "query"),
                *self.parameters(spec.headers, "header"),
            ],
            "responses": self.responses(spec),
        }
        if spec.description:
            rendered["description"] = spec.description
        if spec.body is not None:
            rendered["requestBody"] = self.body(spec)
        return rendered

    def parameters(self, model: type[BaseModel] | None, where: str) -> list[dict[str, Any]]:
        if model is None:
            return []
        name = self.refs[model, "validation"]["$ref"].rsplit("/", 1)[-1]
        self.parameter_models.add(name)
        schema = self.components[name]
        required = set(schema.get("required", ()))
        found = []
        for key, prop in schema.get("properties", {}).items():
            entry: dict[str, Any] = {
                "name": key,
                "in": where,
                "required": where == "path" or key in required,
                "schema": _not_null(prop),
            }
            if "description" in prop:
                entry["description"] = prop["description"]
            found.append(entry)
        return found

    def body(self, spec: Spec) -> dict[str, Any]:
        if isinstance(spec.body, RawBody):
            content = {media: {"schema": self._schema(s)} for media, s in spec.body.media.items()}
            body: dict[str, Any] = {"required": spec.body.required, "content": content}
            if spec.body.description:
                body["description"] = spec.body.description
            return body
        assert spec.body is not None
        schema = self.refs[spec.body, "validation"]
        return {"required": spec.body_required, "content": {"application/json": {"schema": schema}}}

    def _schema(self, schema: Any) -> dict[str, Any]:
        if isinstance(schema, type):
            ref: dict[str, Any] = self.refs[schema, "validation"]
            return ref
        return dict(schema)

    def responses(self, spec: Spec) -> dict[str, Any]:
        shapes = {
            "application/json": self.refs[ErrorBody, "serialization"],
            "text/html": PAGE,
            "*/*": {"description": "an upstream's own error, relayed as it gave it"},
        }
        error = {media: {"schema": shapes[media]} for media in spec.error_media}
        rendered: dict[str, Any] = {}
        for status, codes in sorted(spec.all_errors().items()):
            entry: dict[str, Any] = {"description": codes, "content": error}
            if status in (429, 503):
                entry["headers"] = {"Retry-After": RETRY_AFTER}
            rendered[str(status)] = entry
        for status, answer in spec.responses.items():
            rendered[str(status)] = self.answer(answer)
        if spec.default is not None:
            rendered["default"] = self.answer(spec.default)
        return dict(sorted(rendered.items()))

    def answer(self, answer: Answer) -> dict[str, Any]:
        rendered: dict[str, Any] = {"description": answer.description}
        if answer.model is not None:
            schema = self.refs[answer.model, answer.mode]
            rendered["content"] = {answer.media: {"schema": schema}}
        elif answer.schema is not None:
            rendered["content"] = {answer.media: {"schema": dict(answer.schema)}}
        for media, schema in answer.alternatives.items():
            rendered.setdefault("content", {})[media] = {"schema": dict(schema)}
        if answer.headers:
            rendered["headers"] = {
                name: {"description": text, "schema": {"type": "string"}}
                for name, text in answer.headers.items()
            }
        return rendered


def _not_null(prop: dict[str, Any]) -> dict[str, Any]:
    """A parameter's schema: an optional one is absent, never null (``a | None`` in a model)."""
    schema = {k: v for k, v in prop.items() if k not in ("title", "description", "default")}
    options = [o for o in schema.pop("anyOf", ()) if o != {"type": "null"}]
    if len(options) == 1:
        schema = {**options[0], **schema}
    elif options:
        schema["anyOf"] = options
    if prop.get("default") is not None:
        schema["default"] = prop["default"]
    return schema


def _operation_id(op: Operation) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", f"{op.method}{op.path}").strip("_")


def routes(app_routes: Sequence[BaseRoute]) -> list[BaseRoute]:
    """The ``/openapi.json`` route of an app with ``app_routes`` (itself included)."""
    rendered: list[bytes] = []

    @operation(
        Security.NONE,
        tags=("operations",),
        responses={200: Answer("this document", media="application/json", schema={})},
        uses_store=False,
    )
    async def openapi_schema() -> Response:
        """The OpenAPI 3.1 document of this gateway's HTTP API, generated from its models."""
        if not rendered:  # built once, at the first request: every route exists by then
            everything = [*app_routes, *schema_route]
            rendered.append(json.dumps(document(operations(everything))).encode())
        return Response(rendered[0], media_type="application/json")

    schema_route: list[BaseRoute] = [route("/openapi.json", openapi_schema, "GET")]
    return schema_route
