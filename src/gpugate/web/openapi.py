"""``GET /openapi.json``: the OpenAPI schema of every route, from the routes' docstrings.

A route documents itself in its docstring: a first line for people, then ``---`` and the
operation's OpenAPI fields in YAML (Starlette's :class:`~starlette.schemas.SchemaGenerator`).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.schemas import SchemaGenerator

from gpugate import __version__

_BASE = {
    "openapi": "3.0.0",
    "info": {"title": "gpugate", "version": __version__},
    "components": {
        "securitySchemes": {
            "admin": {"type": "http", "scheme": "bearer"},
            "worker": {"type": "http", "scheme": "bearer"},
        },
    },
}


async def openapi_schema(request: Request) -> Response:
    """The OpenAPI schema of this gateway's HTTP API."""
    schema = SchemaGenerator(_BASE).get_schema(request.app.routes)
    for path, operations in schema.get("paths", {}).items():
        if path.startswith("/admin/"):
            for operation in operations.values():
                operation.setdefault("security", [{"admin": []}])
    return JSONResponse(schema)


routes = [Route("/openapi.json", openapi_schema, methods=["GET"], include_in_schema=False)]
