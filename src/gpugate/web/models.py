"""``GET /v1/models``: the models the fleet can serve right now, in OpenAI's list shape."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpugate.wiring import Gateway


async def list_models(request: Request) -> Response:
    """Models with at least one endpoint in rotation (healthy, not faulted, not ejected)."""
    gateway: Gateway = request.app.state.gateway
    created = int(gateway.started_at.timestamp())
    data = [
        {"id": model, "object": "model", "created": created, "owned_by": "gpugate"}
        for model in gateway.registry.models()
    ]
    return JSONResponse({"object": "list", "data": data})


routes = [Route("/v1/models", list_models, methods=["GET"])]
