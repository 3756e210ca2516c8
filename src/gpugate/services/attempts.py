"""The pieces of one request's tries on the sync path: how a try ended, what to keep of a failed
one, and how an upstream's answer is read (a 400 that says "context too long", an SSE stream's
first event).

The loop that uses them is :meth:`gpugate.services.proxy.Proxy.open`; nothing here waits or
sends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpugate.errors import GpugateError

#: The most of a failed try's body kept to relay if nothing better comes (an error is small).
KEEP_LIMIT = 64 * 1024


class Outcome(StrEnum):
    """How one try ended: the ``outcome`` label of ``gateway_upstream_attempts_total``."""

    OK = "ok"  # an answer to relay (2xx/3xx)
    CLIENT_ERROR = "4xx"  # an answer too: the request's fault, never retried on the same model
    CONTEXT = "context_length"  # 400 context_length_exceeded: served by a context fallback
    RATE_LIMITED = "429"
    BUSY = "503"
    SERVER_ERROR = "5xx"
    CONNECT = "connect_error"  # nothing reached the upstream
    DROPPED = "dropped"  # the connection died before any response byte
    TIMEOUT = "timeout"  # no response (or no first event) within the deadline
    BAD_START = "bad_start"  # 200, then an error event, garbage or the end before any data
    BUSY_ENDPOINT = "skipped_busy"  # not sent: every endpoint backed off and a fallback exists


class Reason(StrEnum):
    """Why a request went on to a fallback model: the ``reason`` of ``gateway_fallbacks_total``."""

    FAILED = "failed"  # every try of the model failed (after retries)
    OUT_OF_ROTATION = "out_of_rotation"  # no endpoint of the model may take traffic now
    BUSY = "busy"  # every endpoint asked for less traffic (429/503 backoff)
    CONTEXT = "context_length"
    STREAM_BROKE = "stream_broke"  # a continuation of a broken stream


class Buffered:
    """A finished upstream response held in memory, read like an :class:`UpstreamResponse`."""

    __slots__ = ("_body", "headers", "status")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self._body = body

    async def read_chunk(self) -> bytes:
        body, self._body = self._body, b""
        return body

    def at_eof(self) -> bool:
        return not self._body

    def set_idle_timeout(self, seconds: float | None) -> None:
        """Nothing to time: the body is here."""

    def release(self) -> None:
        self._body = b""


@dataclass(slots=True)
class Failure:
    """What a failed try leaves for the client if no later try answers: the upstream's own
    response (kept whole), or our error."""

    outcome: Outcome
    kept: Buffered | None = None
    error: GpugateError | None = None
    upstream: Any = None  # the UpstreamState and EndpointState that answered ``kept``
    endpoint: Any = None
    model: str | None = None


def error_fields(body: bytes) -> tuple[str, str, str]:
    """``(code, type, message)`` of an OpenAI-shaped (or vLLM-shaped) error body, lower-cased;
    empty strings where the body does not say."""
    try:
        doc = json.loads(body)
    except ValueError:
        return "", "", body[:512].decode("utf-8", "replace").lower()
    error: Any = doc.get("error", doc) if isinstance(doc, dict) else None
    if isinstance(error, str):
        return "", "", error.lower()
    if not isinstance(error, dict):
        return "", "", ""
    return tuple(str(error.get(k) or "").lower() for k in ("code", "type", "message"))  # type: ignore[return-value]


#: OpenAI's code and message, vLLM's serving-layer message ("This model's maximum context length
#: is ..."), vLLM's engine check ("The decoder prompt (length N) is longer than the maximum model
#: length of M", multimodal prompts among others) and SGLang's ("... longer than the model's
#: context length ...").
_CONTEXT_WORDS = (
    "context_length_exceeded",
    "maximum context length",
    "context length",
    "maximum model length",
)
_POLICY_WORDS = ("content_filter", "content_policy", "content policy", "safety")


def is_context_exceeded(body: bytes) -> bool:
    """Whether a 400's body says the prompt is longer than the model's context (OpenAI's
    ``code: context_length_exceeded``, or vLLM's "maximum context length" / "longer than the
    maximum model length" messages) — and is not a content-policy refusal, which is never
    routed around."""
    code, kind, message = error_fields(body)
    words = f"{code} {kind} {message}"
    if any(w in words for w in _POLICY_WORDS):
        return False
    return any(w in words for w in _CONTEXT_WORDS)


def first_event_error(event: bytes) -> bool:
    """Whether an SSE stream's first data event is an error (``{"error": ...}``) or garbage."""
    for line in event.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return False
        try:
            doc = json.loads(data)
        except ValueError:
            return True
        return not isinstance(doc, dict) or "error" in doc
    return False


def first_data_end(buffer: bytes) -> int:
    """The end (exclusive) of the first complete SSE event holding a ``data:`` line in
    ``buffer``, or -1 when no such event is complete yet."""
    start = 0
    while True:
        end = buffer.find(b"\n\n", start)
        if end < 0:
            return -1
        event = buffer[start:end]
        if event.startswith(b"data:") or b"\ndata:" in event:
            return end + 2
        start = end + 2


def with_model(doc: dict[str, Any] | None, body: bytes | None, model: str) -> bytes:
    """The request body with ``model`` rewritten (for a fallback model)."""
    if doc is None:
        doc = json.loads(body or b"{}")
    return json.dumps({**doc, "model": model}, separators=(",", ":")).encode()
