"""``/admin/config``: export, import (replace), versions and rollback of the gateway config.

Export answers the current version in the config file's schema — JSON, or YAML when the client
sends ``Accept: application/yaml`` — with the version in ``X-Config-Version`` and nothing else
in the body. Import takes JSON or YAML by ``Content-Type`` and replaces the gateway document
whole; an invalid one answers 422 ``CONFIG_INVALID`` with every problem (path, message, line)
and changes nothing.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpugate.config.gateway_import import render_gateway_document
from gpugate.errors import BadRequest, ConfigError
from gpugate.web.admin import admin, admin_actor
from gpugate.web.bodies import read_body
from gpugate.web.errors import error_body, status_of

if TYPE_CHECKING:
    from starlette.requests import Request

    from gpugate.config.gateway_import import Media
    from gpugate.services.config_versions import ConfigVersions, Imported
    from gpugate.store import ConfigVersion
    from gpugate.wiring import Gateway

VERSION_HEADER = "X-Config-Version"
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
JSON_TYPES = ("application/json", "")
MAX_VERSIONS = 500


def _versions(gateway: Gateway) -> ConfigVersions:
    assert gateway.config_versions is not None
    return gateway.config_versions


def _wants_yaml(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return any(kind in accept for kind in YAML_TYPES)


def _body_media(request: Request) -> Media:
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind in YAML_TYPES:
        return "yaml"
    if kind in JSON_TYPES:
        return "json"
    raise BadRequest(
        f"unsupported Content-Type {kind!r} for a config import: "
        "send application/json or application/yaml"
    )


def problems_response(exc: ConfigError) -> Response:
    """422 ``CONFIG_INVALID`` in the usual error shape, plus every problem as data."""
    body = json.loads(error_body(exc))
    body["error"]["problems"] = [
        {"path": p.path, "message": p.message, "line": p.line} for p in exc.problems
    ]
    return JSONResponse(body, status_code=status_of(exc))


def _result(result: Imported, **extra: Any) -> Response:
    body = {"version": result.version, "changed": result.changed, **extra}
    return JSONResponse(body, headers={VERSION_HEADER: str(result.version)})


def version_view(version: ConfigVersion, current: int) -> dict[str, Any]:
    """One stored version, without its document."""
    return {
        "version": version.version,
        "created_at": version.created_at.isoformat(),
        "actor": version.actor,
        "note": version.note,
        "current": version.version == current,
    }


@admin
async def export_config(request: Request, gateway: Gateway) -> Response:
    """Export the current gateway config version.
    ---
    summary: Export the current gateway config (upstreams, runtimes, chain, stop conditions)
    description: >-
      The body is exactly the config file's schema for the gateway keys, nothing added: JSON by
      default, YAML with `Accept: application/yaml`. The version is in `X-Config-Version`.
    responses:
      200: {description: "the document; header X-Config-Version: the version number"}
      401: {description: UNAUTHORIZED}
    """
    return await exported(gateway, "yaml" if _wants_yaml(request) else "json")


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


@admin
async def import_config(request: Request, gateway: Gateway) -> Response:
    """Import a whole gateway config document (replace semantics).
    ---
    summary: Replace the gateway config with a whole document (JSON or YAML by Content-Type)
    description: >-
      Validated first, every problem reported at once (path, message, line for YAML); an invalid
      document changes nothing. A valid one is stored as a new version (audited) and takes
      effect at once here and within `server.config_poll_s` on every replica, without a
      restart. A document equal to the current version changes nothing (`changed: false`).
      `X-Gpugate-Actor` names the operator in the audit log.
    responses:
      200: {description: "{version, changed}; header X-Config-Version"}
      400: {description: BAD_REQUEST (unsupported Content-Type)}
      401: {description: UNAUTHORIZED}
      413: {description: PAYLOAD_TOO_LARGE}
      422: {description: "CONFIG_INVALID, with error.problems: [{path, message, line}]"}
    """
    media = _body_media(request)
    raw = await read_body(request, gateway.config.server.max_body_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the config document is not UTF-8 text (byte {exc.start})") from exc
    try:
        result = await _versions(gateway).import_text(text, media=media, actor=admin_actor(request))
    except ConfigError as exc:
        return problems_response(exc)
    return _result(result)


@admin
async def list_versions(request: Request, gateway: Gateway) -> Response:
    """List the stored gateway config versions, newest first.
    ---
    summary: Stored gateway config versions, newest first (`?limit=`, default 50)
    responses:
      200: {description: "{versions: [{version, created_at, actor, note, current}]}"}
      401: {description: UNAUTHORIZED}
    """
    raw = request.query_params.get("limit", "50")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_VERSIONS:
        raise BadRequest(f"limit must be 1 to {MAX_VERSIONS}")
    versions = await _versions(gateway).versions(int(raw))
    current = gateway.config_version
    return JSONResponse({"versions": [version_view(v, current) for v in versions]})


@admin
async def rollback_config(request: Request, gateway: Gateway) -> Response:
    """Roll the gateway config back to an earlier version.
    ---
    summary: Store an earlier version's document again as a new version, in effect at once
    responses:
      200: {description: "{version, changed, rolled_back_to}; header X-Config-Version"}
      401: {description: UNAUTHORIZED}
      404: {description: UNKNOWN_CONFIG_VERSION}
      422: {description: CONFIG_INVALID (the old version does not validate any more)}
    """
    target: int = request.path_params["version"]
    try:
        result = await _versions(gateway).rollback(target, actor=admin_actor(request))
    except ConfigError as exc:
        return problems_response(exc)
    return _result(result, rolled_back_to=target)


routes = [
    Route("/admin/config", export_config, methods=["GET"]),
    Route("/admin/config", import_config, methods=["PUT"]),
    Route("/admin/config/versions", list_versions, methods=["GET"]),
    Route("/admin/config/rollback/{version:int}", rollback_config, methods=["POST"]),
]
