"""``/admin/config``: export, import (replace), versions and rollback of the gateway config.

Export answers the current version in the config file's schema — JSON, or YAML when the client
sends ``Accept: application/yaml`` — with the version in ``X-Config-Version`` and nothing else
in the body. Import takes JSON or YAML by ``Content-Type`` and replaces the gateway document
whole; an invalid one answers 422 ``CONFIG_INVALID`` with every problem (path, message, line)
and changes nothing.
"""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gpugate.config.gateway_import import render_gateway_document
from gpugate.errors import BadRequest, ConfigError
from gpugate.web.api import operation, route
from gpugate.web.bodies import read_body
from gpugate.web.errors import error_body, status_of
from gpugate.web.schemas.admin import AdminHeaders
from gpugate.web.schemas.config import (
    ExportHeaders,
    GatewayDocument,
    ImportHeaders,
    ImportResult,
    RollbackResult,
    VersionList,
    VersionPath,
    VersionsQuery,
    VersionView,
)
from gpugate.web.schemas.operation import Answer, RawBody, Security
from gpugate.wiring import Gateway

if TYPE_CHECKING:
    from gpugate.config.gateway_import import Media
    from gpugate.services.config_versions import ConfigVersions
    from gpugate.store import ConfigVersion

VERSION_HEADER = "X-Config-Version"
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
JSON_TYPES = ("application/json", "")
TAGS = ("admin", "config")
admin = partial(operation, Security.ADMIN, tags=TAGS)  # every operation here
VERSION = {VERSION_HEADER: "the version number now in effect"}
INVALID = {422: "CONFIG_INVALID: every problem in `error.problems` (path, message, line)"}
DOCUMENT = {"application/json": GatewayDocument, "application/yaml": GatewayDocument}


def _versions(gateway: Gateway) -> ConfigVersions:
    return gateway.config_versions


def _wants_yaml(accept: str | None) -> bool:
    """Whether ``Accept`` prefers YAML to JSON (RFC 9110 §12.5.1: media types compared without
    case, each at its ``q``, 1 by default); a tie, or no ``Accept``, is JSON."""
    best = {"yaml": 0.0, "json": 0.0}
    for entry in (accept or "").split(","):
        kind, *params = (part.strip().lower() for part in entry.split(";"))
        q = next((_quality(p[2:]) for p in params if p.startswith("q=")), 1.0)
        media = "yaml" if kind in YAML_TYPES else "json" if kind in _JSON_RANGES else None
        if media is not None:
            best[media] = max(best[media], q)
    return best["yaml"] > best["json"]


_JSON_RANGES = ("application/json", "application/*", "*/*")


def _quality(text: str) -> float:
    try:
        q = float(text)
    except ValueError:
        return 0.0
    return q if 0.0 <= q <= 1.0 else 0.0


def _body_media(content_type: str | None) -> Media:
    kind = (content_type or "").partition(";")[0].strip().lower()
    if kind in YAML_TYPES:
        return "yaml"
    if kind in JSON_TYPES:
        return "json"
    raise BadRequest(
        f"unsupported Content-Type {kind[:80]!r} for a config import: "
        "send application/json or application/yaml"
    )


def problems_response(exc: ConfigError) -> Response:
    """422 ``CONFIG_INVALID`` in the usual error shape, plus every problem as data."""
    body = json.loads(error_body(exc))
    body["error"]["type"] = "invalid_request_error"  # the client's document, not the server
    body["error"]["problems"] = [
        {"path": p.path, "message": p.message, "line": p.line} for p in exc.problems
    ]
    return JSONResponse(body, status_code=status_of(exc))


def _result(view: ImportResult) -> Response:
    return Response(
        view.to_bytes(),
        media_type="application/json",
        headers={VERSION_HEADER: str(view.version)},
    )


def version_view(version: ConfigVersion, current: int) -> dict[str, Any]:
    """One stored version, without its document, as JSON data (for the console's pages)."""
    return _version(version, current).as_json()


def _version(version: ConfigVersion, current: int) -> VersionView:
    return VersionView.of(version).model_copy(update={"current": version.version == current})


@admin(
    responses={
        200: Answer(
            "the document: JSON, or YAML for `Accept: application/yaml`",
            GatewayDocument,
            headers=VERSION,
            mode="validation",  # the config models serialize through a function: no schema
        )
    },
)
async def export_config(gateway: Gateway, headers: ExportHeaders) -> Response:
    """Export the current gateway config (upstreams, runtimes, chain, stop conditions).

    The body is exactly the config file's schema for the gateway keys, nothing added: JSON by
    default, YAML with `Accept: application/yaml`. The version is in `X-Config-Version`.
    """
    return await exported(gateway, "yaml" if _wants_yaml(headers.accept) else "json")


async def exported(gateway: Gateway, media: Media, *, download: bool = False) -> Response:
    """The current config version as a document in ``media``, its version in
    ``X-Config-Version``; ``download``: as an attachment named ``gateway.v<version>.<media>``."""
    current = await _versions(gateway).export()
    text = render_gateway_document(current.document, media=media)
    kind = "application/yaml" if media == "yaml" else "application/json"
    headers = {VERSION_HEADER: str(current.version)}
    if download:
        name = f"gateway.v{current.version}.{media}"
        headers["Content-Disposition"] = f'attachment; filename="{name}"'
    return Response(text, media_type=kind, headers=headers)


@admin(
    responses={
        200: Answer(
            "the version stored (or the current one, unchanged)", ImportResult, headers=VERSION
        )
    },
    errors={400: "BAD_REQUEST: an unsupported Content-Type, or not UTF-8 text", **INVALID},
    raw_body=RawBody(DOCUMENT, description="a whole gateway document, JSON or YAML"),
)
async def import_config(request: Request, gateway: Gateway, headers: ImportHeaders) -> Response:
    """Replace the gateway config with a whole document (JSON or YAML by Content-Type).

    Validated first, every problem reported at once (path, message, line for YAML); an invalid
    document changes nothing. A valid one is stored as a new version (audited) and takes
    effect at once here and within `server.config_poll_s` on every replica, without a
    restart. A document equal to the current version changes nothing (`changed: false`).
    YAML is read within limits (nesting, and size with its aliases expanded) and parsed off
    the event loop. `X-Gpugate-Actor` names the operator in the audit log.
    """
    media = _body_media(headers.content_type)
    raw = await read_body(request, gateway.config.server.max_body_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the config document is not UTF-8 text (byte {exc.start})") from exc
    try:
        result = await _versions(gateway).import_text(text, media=media, actor=headers.actor)
    except ConfigError as exc:
        return problems_response(exc)
    return _result(ImportResult(version=result.version, changed=result.changed))


@admin(responses={200: Answer("newest first", VersionList)})
async def list_versions(gateway: Gateway, query: VersionsQuery) -> VersionList:
    """The stored gateway config versions, newest first (`?limit=`, default 50)."""
    versions = await _versions(gateway).versions(query.limit)
    current = gateway.config_version
    return VersionList(versions=[_version(v, current) for v in versions])


@admin(
    responses={200: Answer("the new version", RollbackResult, headers=VERSION)},
    errors={
        404: "UNKNOWN_CONFIG_VERSION",
        422: "CONFIG_INVALID: the old version no longer validates",
    },
)
async def rollback_config(gateway: Gateway, path: VersionPath, headers: AdminHeaders) -> Response:
    """Store an earlier version's document again as a new version, in effect at once."""
    try:
        result = await _versions(gateway).rollback(path.version, actor=headers.actor)
    except ConfigError as exc:
        return problems_response(exc)
    view = RollbackResult(
        version=result.version, changed=result.changed, rolled_back_to=path.version
    )
    return _result(view)


routes = [
    route("/admin/config", export_config, "GET"),
    route("/admin/config", import_config, "PUT"),
    route("/admin/config/versions", list_versions, "GET"),
    route("/admin/config/rollback/{version}", rollback_config, "POST"),
]
