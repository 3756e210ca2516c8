"""The data plane's operations (DESIGN §3), documented here: they are served by raw ASGI in
:mod:`gpugate.web.dataplane`, which reads only ``model`` and ``stream`` and forwards the body's
bytes, so these models describe a body without being its validation."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpugate.core.classes import HEADER as CLASS_HEADER
from gpugate.core.classes import RequestClass
from gpugate.web.schemas.common import MAX_KEY_LENGTH, Key, Query
from gpugate.web.schemas.operation import Answer, Operation, RawBody, Security, Spec

_ROUTED = "Routed by the body's `model`; everything else in the body goes to the upstream as sent."
_STREAMED = '`"stream": true` is passed through as server-sent events, chunk by chunk.'


class OpenAIBody(BaseModel):
    """An OpenAI-shaped request: ``model`` routes it; the rest is the upstream's to read."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, description="the model; picks the upstream")


class ChatCompletionRequest(OpenAIBody):
    messages: list[dict[str, Any]] = Field(description="OpenAI chat messages")
    stream: bool = False


class CompletionRequest(OpenAIBody):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(description="the prompt")
    stream: bool = False


class EmbeddingRequest(OpenAIBody):
    input: str | list[str] | list[int] | list[list[int]] = Field(description="text to embed")


class UpstreamAnswer(BaseModel):
    """The upstream's own JSON answer, relayed byte for byte."""

    model_config = ConfigDict(extra="allow")


class DataPlaneHeaders(Query):
    request_class: RequestClass | None = Field(
        None,
        alias=CLASS_HEADER,
        description="who goes first when the upstream is busy (default interactive); an "
        "unknown value is a 400 naming the valid ones",
    )
    idempotency_key: Key | None = Field(
        None,
        alias="Idempotency-Key",
        max_length=MAX_KEY_LENGTH,
        description="a replay of a completed non-streaming request returns the stored "
        "response with `Idempotent-Replayed: true`; while the first is in flight 409, with "
        "another body 422",
    )
    request_id: str | None = Field(
        None,
        alias="X-Request-Id",
        pattern=r"^[A-Za-z0-9._:-]{1,128}$",
        description="echoed in the response and the logs (made up when absent or not sane)",
    )
    session_id: str | None = Field(
        None,
        alias="X-Session-Id",
        description="the conversation this request belongs to (else the body's `user`): with "
        "routing `prefix_affinity` it stays on the endpoint that served it last unless that "
        "one is out or much busier (docs/routing.md)",
    )


class RawPath(Query):
    upstream_id: Key = Field(description="the upstream's id")
    path: str = Field(description="the path on the upstream, after its base path")


class RawHeaders(Query):
    request_class: RequestClass | None = Field(None, alias=CLASS_HEADER)
    request_id: str | None = Field(None, alias="X-Request-Id")


GATEWAY_HEADERS = {
    "X-Gateway-Upstream": "the upstream's id",
    "X-Gateway-Overhead-Ms": "time spent in the gateway, excluding the upstream",
    "X-Gateway-Model": "the model that answered (after any fallback)",
    "X-Gateway-Attempts": "tries made",
    "X-Request-Id": "the request's id",
}
_ANSWER = Answer(
    "the upstream's answer: JSON, or server-sent events when streaming",
    UpstreamAnswer,
    headers=GATEWAY_HEADERS,
    alternatives={"text/event-stream": {"type": "string"}},
)
RELAYED_ERRORS = ("application/json", "*/*")  # the gateway's own, or the upstream's as it gave it
_RELAYED = Answer("the upstream's own answer, relayed whatever its status", headers=GATEWAY_HEADERS)
_ERRORS = {
    401: "UNAUTHORIZED: auth.mode keys, and no key or not a valid one",
    403: "MODEL_NOT_ALLOWED, EXTERNAL_UPSTREAM_FORBIDDEN",
    404: "UNKNOWN_MODEL: no upstream serves the model",
    409: "IDEMPOTENCY_CONFLICT: the same Idempotency-Key is still in flight",
    422: "IDEMPOTENCY_KEY_REUSED: the same Idempotency-Key with another body",
    429: "GPU_SATURATED (batch), RATE_LIMITED, TOKEN_LIMITED, CONCURRENCY_LIMITED, "
    "BUDGET_EXCEEDED; Retry-After",
    502: "UPSTREAM_UNREACHABLE",
    503: "NO_HEALTHY_UPSTREAM (the whole fallback chain is out), QUEUE_TIMEOUT, QUEUE_FULL, "
    "GATEWAY_OVERLOADED (the gateway is out of file descriptors); Retry-After",
    504: "UPSTREAM_TIMEOUT",
}
_RAW_ERRORS = {
    **_ERRORS,
    400: "BAD_REQUEST: a dot segment, an encoded / \\ ? #, or a malformed escape in the path",
    403: "RAW_FORBIDDEN: an azure-di, external or keyed upstream without `raw:` for this "
    "method and path; EXTERNAL_UPSTREAM_FORBIDDEN: X-Allow-External false, external upstream",
    404: "UNKNOWN_UPSTREAM: no upstream has this id",
    413: "PAYLOAD_TOO_LARGE: the body is over server.max_body_bytes",
}


def _openai(summary: str, body: type[BaseModel], *, streams: bool = True) -> Spec:
    return Spec(
        summary=summary,
        description=f"{_ROUTED} {_STREAMED if streams else ''}".strip(),
        security=Security.CLIENT,
        tags=("data plane",),
        responses={200: _ANSWER},
        errors=_ERRORS,
        body=body,
        headers=DataPlaneHeaders,
        uses_store=False,
        default=_RELAYED,
        error_media=RELAYED_ERRORS,
    )


_RAW = Spec(
    summary="Raw pass-through to one named upstream (custom model servers)",
    description="The request goes to the upstream's endpoint under its base path, as sent; "
    "the answer comes back as the upstream gave it, chunk by chunk. Any method: GET, HEAD, "
    "OPTIONS and DELETE without a body (unless one is declared), POST, PUT and PATCH with "
    "one. Passed through as is: an `Idempotency-Key` header goes to the upstream untouched "
    "and the gateway keeps and replays nothing (the upstream's own idempotency, if any, "
    "applies).",
    security=Security.CLIENT,
    tags=("data plane",),
    responses={},
    errors=_RAW_ERRORS,
    path=RawPath,
    headers=RawHeaders,
    uses_store=False,
    default=_RELAYED,
    error_media=RELAYED_ERRORS,
)
_RAW_WITH_BODY = replace(_RAW, body=RawBody({"application/octet-stream": {}}, required=False))

OPERATIONS = (
    Operation(
        "post",
        "/v1/chat/completions",
        _openai("A chat completion from an upstream serving the model", ChatCompletionRequest),
    ),
    Operation(
        "post",
        "/v1/completions",
        _openai("A text completion from an upstream serving the model", CompletionRequest),
    ),
    Operation(
        "post",
        "/v1/embeddings",
        _openai("Embeddings from an upstream serving the model", EmbeddingRequest, streams=False),
    ),
    *(Operation(m, "/u/{upstream_id}/{path}", _RAW) for m in ("get", "head", "options", "delete")),
    *(Operation(m, "/u/{upstream_id}/{path}", _RAW_WITH_BODY) for m in ("post", "put", "patch")),
)
