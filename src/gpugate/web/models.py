"""``GET /v1/models``: the models the fleet can serve right now, in OpenAI's list shape."""

from __future__ import annotations

from starlette.requests import Request

from gpugate.web.api import operation, route
from gpugate.web.auth import principal_of, served_externally
from gpugate.web.schemas.operation import Answer, Security
from gpugate.web.schemas.ops import ModelEntry, ModelList
from gpugate.wiring import Gateway


@operation(
    Security.CLIENT,
    tags=("data plane",),
    responses={200: Answer("the models, in OpenAI's list shape", ModelList)},
    uses_store=False,
)
async def list_models(request: Request, gateway: Gateway) -> ModelList:
    """The models with at least one endpoint in rotation (healthy, not faulted, not ejected);
    with a client key, only those it may use (a key without `allow_external`: none that an
    `external` upstream serves)."""
    created = int(gateway.started_at.timestamp())
    principal = principal_of(request)
    external = principal is None or principal.key.allow_external
    # such a key is refused a model any external upstream serves (ClientKeys.allowed)
    refused = frozenset() if external else served_externally(gateway.config)
    data = [
        ModelEntry(id=model, object="model", created=created, owned_by="gpugate")
        for model in gateway.registry.models(external=external)
        if (principal is None or principal.key.may_use_model(model)) and model not in refused
    ]
    return ModelList(object="list", data=data)


routes = [route("/v1/models", list_models, "GET")]
