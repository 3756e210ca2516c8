"""``/admin/config``'s bodies: the gateway document, import results, versions."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from gpugate.config import GATEWAY_KEYS, GatewayConfig
from gpugate.web.schemas.admin import AdminHeaders
from gpugate.web.schemas.common import Query, Timestamp, View

MAX_VERSIONS = 500


def _gateway_document() -> type[BaseModel]:
    """The gateway keys of the config file's schema (DESIGN §2), for the document only: an
    import is validated by the config tree itself (every problem, with its line)."""
    fields: dict[str, Any] = {
        key: (GatewayConfig.model_fields[key].annotation, GatewayConfig.model_fields[key])
        for key in GATEWAY_KEYS
    }
    return create_model(
        "GatewayDocument",
        __config__=ConfigDict(extra="forbid"),
        __doc__="The gateway document: the config file's schema for the gateway keys.",
        **fields,
    )


GatewayDocument = _gateway_document()


class ImportResult(View):
    version: int
    changed: bool = Field(description="false: the document equals the current version")


class RollbackResult(ImportResult):
    rolled_back_to: int


class VersionView(View):
    version: int
    created_at: Timestamp
    actor: str
    note: str
    current: bool = False


class VersionList(View):
    versions: list[VersionView]


class VersionsQuery(Query):
    limit: int = Field(50, ge=1, le=MAX_VERSIONS)


class VersionPath(Query):
    version: int = Field(ge=0, lt=2**63)


class ExportHeaders(Query):
    accept: str | None = Field(
        None, alias="Accept", description="`application/yaml` for YAML (default JSON)"
    )


class ImportHeaders(AdminHeaders):
    content_type: str | None = Field(
        None,
        alias="Content-Type",
        description="application/json (default) or application/yaml",
    )
