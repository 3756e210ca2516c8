"""The Azure Document Intelligence pass-through's route (:mod:`gpugate.web.azure_di`),
documented here for ``GET /openapi.json``."""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from gpugate.web.schemas.common import Query
from gpugate.web.schemas.operation import Answer, Operation, RawBody, Security, Spec


class DiPath(Query):
    path: str = Field(
        min_length=1,
        max_length=2048,
        description="documentintelligence/documentModels/{model}:analyze, or "
        "documentintelligence/documentModels/{model}/analyzeResults/{id}",
    )


class DiHeaders(Query):
    allow_external: str | None = Field(
        None, alias="X-Allow-External", description="`false`: refuse (403), the service is external"
    )
    request_class: str | None = Field(None, alias="X-Request-Class")


_POLL = Spec(
    summary="Azure Document Intelligence pass-through: a poll of an analysis",
    description="Goes to the `azure-di` upstream listing `{model}` with its key in "
    "`Ocp-Apim-Subscription-Key`; the query string is passed through. Never shed (no GPU of "
    "ours).",
    security=Security.CLIENT,
    tags=("azure-di",),
    responses={200: Answer("the analysis: status notStarted, running, succeeded or failed")},
    errors={
        400: "BAD_REQUEST: not an analyze or poll path",
        403: "EXTERNAL_UPSTREAM_FORBIDDEN: X-Allow-External false",
        404: "UNKNOWN_MODEL",
        502: "UPSTREAM_UNREACHABLE",
        503: "NO_HEALTHY_UPSTREAM, QUEUE_TIMEOUT; Retry-After",
        504: "UPSTREAM_TIMEOUT",
    },
    path=DiPath,
    headers=DiHeaders,
    uses_store=False,
)
_ANALYZE = replace(
    _POLL,
    summary="Azure Document Intelligence pass-through: analyze a document",
    responses={202: Answer("accepted: Operation-Location (on the gateway), Retry-After")},
    body=RawBody({"application/json": {}, "application/octet-stream": {}}),
)

OPERATIONS = (
    Operation("get", "/azure-di/{path}", _POLL),
    Operation("post", "/azure-di/{path}", _ANALYZE),
)
