"""The Azure Document Intelligence pass-through's parameters (:mod:`gpugate.web.azure_di`): its
path and the headers it reads; the body is passed through as it came."""

from __future__ import annotations

from pydantic import Field

from gpugate.web.schemas.common import Query


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
