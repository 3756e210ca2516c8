"""``/azure-di/{path}``: the Azure Document Intelligence pass-through (see
:mod:`gpugate.services.azure_di`). Request header ``X-Allow-External: false`` refuses it (403)."""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import Response

from gpugate.core.classes import RequestClass, parse_request_class
from gpugate.errors import GpugateError, UpstreamError
from gpugate.services.azure_di import (
    AzureDocumentIntelligence,
    DiRequest,
    allow_external,
    gateway_base,
    rewrite_location,
)
from gpugate.services.proxy import Outbound, Reply
from gpugate.web.api import operation, route
from gpugate.web.auth import di_allowed, principal_of
from gpugate.web.bodies import read_body
from gpugate.web.schemas.azure_di import DiHeaders, DiPath
from gpugate.web.schemas.operation import Answer, RawBody, Security
from gpugate.wiring import Gateway

_OPERATION_LOCATION = b"operation-location"
_NOT_RELAYED = frozenset({b"content-length", b"transfer-encoding", b"connection"})


_ERRORS = {
    400: "BAD_REQUEST: not an analyze or poll path, or an unknown Host",
    403: "EXTERNAL_UPSTREAM_FORBIDDEN (X-Allow-External false, or a client key without "
    "allow_external), MODEL_NOT_ALLOWED (a client key limited to models)",
    404: "UNKNOWN_MODEL",
    502: "UPSTREAM_UNREACHABLE",
    503: "NO_HEALTHY_UPSTREAM, QUEUE_TIMEOUT; Retry-After",
    504: "UPSTREAM_TIMEOUT",
}
di = partial(operation, Security.CLIENT, tags=("azure-di",), errors=_ERRORS, uses_store=False)


@di(responses={200: Answer("the analysis: status notStarted, running, succeeded or failed")})
async def poll(request: Request, gateway: Gateway, path: DiPath, headers: DiHeaders) -> Response:
    """Azure Document Intelligence pass-through: a poll of an analysis.

    `GET /azure-di/documentintelligence/documentModels/{model}/analyzeResults/{id}`, query
    string passed through, goes to the `azure-di` upstream listing `{model}` with its key in
    `Ocp-Apim-Subscription-Key`. Never shed (no GPU of ours). Header `X-Allow-External: false`
    refuses the request.
    """
    return await forward(request, gateway, path, headers)


@di(
    responses={202: Answer("accepted: Operation-Location (on the gateway), Retry-After")},
    raw_body=RawBody({"application/json": {}, "application/octet-stream": {}}),
)
async def analyze(request: Request, gateway: Gateway, path: DiPath, headers: DiHeaders) -> Response:
    """Azure Document Intelligence pass-through: analyze a document.

    `POST /azure-di/documentintelligence/documentModels/{model}:analyze`, query string and body
    passed through, goes to the `azure-di` upstream listing `{model}` with its key in
    `Ocp-Apim-Subscription-Key`. The 202's `Operation-Location` is rewritten to the gateway:
    built on server.public_url, or on the client's Host when that is a loopback name or the
    listen host (any other Host: 400). Never shed (no GPU of ours). Header `X-Allow-External:
    false` refuses the request.
    """
    return await forward(request, gateway, path, headers)


async def forward(request: Request, gateway: Gateway, path: DiPath, headers: DiHeaders) -> Response:
    """Forward an analyze or a poll; the 202's ``Operation-Location`` points at the gateway."""
    facade = gateway.azure_di
    principal = principal_of(request)  # auth.mode keys: Security.CLIENT checked the key
    if principal is not None:
        di_allowed(principal)
    config = gateway.config
    base_url = gateway_base(
        config.server.public_url, config.host, str(request.base_url), request.headers.get("host")
    )
    cls = parse_request_class(headers.request_class, default=RequestClass.INTERACTIVE)
    if principal is not None:
        cls = principal.key.clamp(cls)
    body = None
    if request.method == "POST":
        body = await read_body(request, gateway.config.server.max_body_bytes)
    di = DiRequest(
        request.method,
        path.path,
        request.url.query,
        request.scope["headers"],
        body,
        cls,
    )
    out = facade.outbound(di, external_allowed=allow_external(headers.allow_external))
    return await _relay(facade, out, base_url)


async def _relay(facade: AzureDocumentIntelligence, out: Outbound, base_url: str) -> Response:
    try:
        reply = await facade.open(out)
    except GpugateError as exc:
        facade.refused(out, exc)
        raise
    code: str | None = None
    try:
        try:
            content = await _read_all(reply)
        except UpstreamError as exc:
            reply.broke()
            code = exc.code
            raise
        endpoint = reply.endpoint.url
        headers = [
            (name, _rewritten(name, value, endpoint, base_url))
            for name, value in reply.headers
            if name not in _NOT_RELAYED
        ]
        headers.append((b"x-gateway-upstream", reply.upstream.id.encode()))
        response = Response(content, status_code=reply.status)
        response.raw_headers = [*headers, (b"content-length", str(len(content)).encode())]
        return response
    finally:
        reply.close(code)


def _rewritten(name: bytes, value: bytes, endpoint: str, base_url: str) -> bytes:
    if name != _OPERATION_LOCATION:
        return value
    return rewrite_location(value.decode("latin-1"), endpoint, base_url).encode("latin-1")


async def _read_all(reply: Reply) -> bytes:
    parts = []
    while chunk := await reply.read_chunk():
        parts.append(chunk)
    return b"".join(parts)


routes = [
    route("/azure-di/{path:path}", poll, "GET"),
    route("/azure-di/{path:path}", analyze, "POST"),
]
