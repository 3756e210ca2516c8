"""``GET /openapi.json``: the OpenAPI schema of the routes that document themselves.

A route documents itself with an OpenAPI operation in YAML as its endpoint's docstring
(Starlette's :class:`~starlette.schemas.SchemaGenerator` reads them); routes without one are
left out rather than guessed at.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.schemas import SchemaGenerator

from gpugate import __version__


async def openapi(request: Request) -> Response:
    generator = SchemaGenerator(
        {"openapi": "3.0.3", "info": {"title": "gpugate", "version": __version__}}
    )
    return JSONResponse(generator.get_schema(routes=request.app.routes))


routes = [Route("/openapi.json", openapi, methods=["GET"], include_in_schema=False)]
