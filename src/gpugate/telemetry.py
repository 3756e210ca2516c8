"""Traces and GenAI measurements of the data plane and the job path (docs/observability.md).

Two things live here, both free of any outside library:

* :class:`Span` and :class:`Tracer`, the small surface the request path and the dispatcher
  call. With OpenTelemetry off (the default) the gateway holds :data:`NO_TRACER`, whose spans
  are one shared :data:`NO_SPAN` doing nothing; the real one is
  :class:`gpugate.adapters.otel.OtelTracer` (the ``gpugate[otel]`` extra), built by the
  composition root only when ``telemetry.otlp_endpoint`` is set.
* :class:`Generation`, which watches a relayed answer go by (bytes only, never parsed whole)
  and tells the time to the first token, the time per output token and the token counts,
  for the Prometheus histograms (always on) and the request span's ``gen_ai.usage.*``.

Span attributes follow the OpenTelemetry semantic conventions (``http.*``, ``server.*``,
``gen_ai.*``) plus a few of ours under ``gpugate.*``. An upstream endpoint is named by its
upstream's id and its place in ``urls`` (``gpugate.endpoint.index``), never by its URL; no
header, prompt or answer text is ever an attribute.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Protocol

AttributeValue = str | int | float | bool


class Kind(StrEnum):
    """A span's kind (OpenTelemetry's ``SpanKind``)."""

    SERVER = "server"
    CLIENT = "client"
    INTERNAL = "internal"


class Span(Protocol):
    """One span: attributes set while it runs, then :meth:`end` once."""

    #: False for :data:`NO_SPAN` and unsampled spans: skip work done only for attributes.
    recording: bool

    def set(self, key: str, value: AttributeValue) -> None: ...

    def child(
        self, name: str, kind: Kind, attributes: Mapping[str, AttributeValue] | None = None
    ) -> Span: ...

    def traceparent(self) -> list[tuple[bytes, bytes]]:
        """The W3C ``traceparent`` (and ``tracestate``) headers naming this span as parent."""
        ...

    def end(self, error: str | None = None) -> None:
        """End the span; ``error`` (a short reason, e.g. an error code) marks it failed."""
        ...


class Tracer(Protocol):
    """Where spans start: a request's (continuing the client's ``traceparent``) or a job's."""

    def request(
        self,
        name: str,
        headers: list[tuple[bytes, bytes]],
        attributes: Mapping[str, AttributeValue],
    ) -> Span: ...

    def start(
        self, name: str, kind: Kind, attributes: Mapping[str, AttributeValue] | None = None
    ) -> Span: ...

    def shutdown(self) -> None:
        """Flush what is buffered and stop exporting (at the gateway's stop)."""
        ...


class _NoSpan:
    """The span of a gateway without tracing: every call returns at once."""

    __slots__ = ()
    recording = False

    def set(self, key: str, value: AttributeValue) -> None:
        """Nothing to record."""

    def child(
        self, name: str, kind: Kind, attributes: Mapping[str, AttributeValue] | None = None
    ) -> Span:
        return self

    def traceparent(self) -> list[tuple[bytes, bytes]]:
        return []

    def end(self, error: str | None = None) -> None:
        """Nothing to end."""

    def __repr__(self) -> str:
        return "<NoSpan>"


class _NoTracer:
    __slots__ = ()

    def request(
        self,
        name: str,
        headers: list[tuple[bytes, bytes]],
        attributes: Mapping[str, AttributeValue],
    ) -> Span:
        return NO_SPAN

    def start(
        self, name: str, kind: Kind, attributes: Mapping[str, AttributeValue] | None = None
    ) -> Span:
        return NO_SPAN

    def shutdown(self) -> None:
        """Nothing buffered."""

    def __repr__(self) -> str:
        return "<NoTracer>"


#: The one span of a gateway without tracing (immutable: no state, shared by every request).
NO_SPAN: Span = _NoSpan()
#: The tracer of a gateway without tracing.
NO_TRACER: Tracer = _NoTracer()

#: ``gen_ai.operation.name`` of each OpenAI route.
OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
}
#: ``gen_ai.provider.name`` by upstream kind: OpenAI's protocol is what every kind speaks.
PROVIDERS = {"azure-di": "azure.ai.document_intelligence"}
TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})


def operation(path: str) -> str:
    """``gen_ai.operation.name`` of a data-plane path (``http`` for ``/u/...``)."""
    return OPERATIONS.get(path.partition("?")[0], "http")


def provider(kind: str) -> str:
    return PROVIDERS.get(kind, "openai")


class _Upstream(Protocol):
    """What an attempt span names of an upstream (an ``UpstreamConfig``)."""

    @property
    def id(self) -> str: ...

    @property
    def kind(self) -> str: ...


def request_span(
    tracer: Tracer,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    server: tuple[str, int] | None,
    model: str | None = None,
) -> Span:
    """The SERVER span of one data-plane request, continuing the client's ``traceparent``;
    :data:`NO_SPAN` at once when tracing is off."""
    if tracer is NO_TRACER:
        return NO_SPAN
    op = operation(path)
    route = path.partition("?")[0] if op != "http" else "/u/{upstream}/{path}"
    attributes: dict[str, AttributeValue] = {
        "http.request.method": method,
        "http.route": route,  # a raw path's own ids are never an attribute: the route only
        "gen_ai.operation.name": op,
    }
    if server is not None:
        attributes["server.address"], attributes["server.port"] = server
    if model is not None:
        attributes["gen_ai.request.model"] = model[:200]
    return tracer.request(f"{method} {route}", headers, attributes)


def attempt_span(parent: Span, path: str, model: str | None, upstream: _Upstream, n: int) -> Span:
    """The CLIENT span of one try sent to ``upstream`` (``n``: its number on this model)."""
    if not parent.recording:
        return NO_SPAN
    op = operation(path)
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": op,
        "gen_ai.provider.name": provider(upstream.kind),
        "gpugate.upstream": upstream.id,
        "gpugate.attempt": n,
    }
    if model is not None:
        attributes["gen_ai.request.model"] = model[:200]
    return parent.child(f"{op} {model or upstream.id}", Kind.CLIENT, attributes)


def attempt_ended(span: Span, outcome: str, status: int | None = None) -> None:
    """End an attempt's span with how the try ended (``gateway_upstream_attempts_total``'s
    ``outcome``: ``ok``, ``4xx``, ``503``, ``timeout``, ...); failed unless ``ok`` or ``4xx``
    (a client's error is an answer, relayed as it came)."""
    if not span.recording:
        return
    if status is not None:
        span.set("http.response.status_code", status)
    span.set("gpugate.attempt.outcome", outcome)
    span.end(None if outcome in ("ok", "4xx") else outcome)


def fallback_span(parent: Span, model: str, to: str, reason: str) -> Span:
    """The INTERNAL span of one fallback hop; the hop's tries are its children."""
    if not parent.recording:
        return NO_SPAN
    attributes: dict[str, AttributeValue] = {
        "gpugate.fallback.from": model,
        "gpugate.fallback.to": to,
        "gpugate.fallback.reason": reason,
        "gen_ai.request.model": to,
    }
    return parent.child(f"fallback {to}", Kind.INTERNAL, attributes)


def continuation_span(parent: Span, model: str | None, after: str) -> Span:
    """The INTERNAL span of one continuation of a stream broken after bytes reached the
    client (``after``: the break's error code); its tries are its children."""
    if not parent.recording:
        return NO_SPAN
    attributes: dict[str, AttributeValue] = {"gpugate.continuation.after": after}
    if model is not None:
        attributes["gen_ai.request.model"] = model[:200]
    return parent.child(f"continuation {model or ''}".rstrip(), Kind.INTERNAL, attributes)


def continuation_ended(span: Span, upstream: str | None, mode: str | None) -> None:
    """End a continuation's span: who continued the stream and how, or failed (none could)."""
    if not span.recording:
        return
    span.set("gpugate.continuation.outcome", mode or "failed")
    if upstream is not None:
        span.set("gpugate.upstream", upstream)
    span.end(None if mode is not None else "failed")


def traced(
    span: Span, headers: list[tuple[bytes, bytes]], endpoints: Sequence[object], endpoint: object
) -> list[tuple[bytes, bytes]]:
    """An attempt's ``headers`` with the client's trace headers replaced by the attempt's (the
    upstream continues it), noting the endpoint's place in its upstream's ``urls``; unchanged
    when the attempt records nothing (the client's own ``traceparent`` goes on as it came)."""
    if not span.recording:
        return headers
    span.set("gpugate.endpoint.index", endpoints.index(endpoint))
    ours = span.traceparent()
    if not ours:
        return headers
    return [(k, v) for k, v in headers if k.lower() not in TRACE_HEADERS] + ours


def refused_span(span: Span, status: int, code: str) -> str | None:
    """Note our error on the request span; the error to end it with: only a 5xx is the
    gateway's failure (HTTP semantic conventions: a 4xx leaves a SERVER span's status unset)."""
    span.set("http.response.status_code", status)
    span.set("error.type", code)
    return code if status >= 500 else None


def generated_span(span: Span, status: int, seen: Generated) -> None:
    """The request span's answer: its status and what the answer told (model, usage)."""
    if not span.recording:
        return
    span.set("http.response.status_code", status)
    if seen.model is not None:
        span.set("gen_ai.response.model", seen.model)
    if seen.input_tokens is not None:
        span.set("gen_ai.usage.input_tokens", seen.input_tokens)
    if seen.output_tokens is not None:
        span.set("gen_ai.usage.output_tokens", seen.output_tokens)
    if seen.ttft is not None:
        span.set("gpugate.time_to_first_token_s", round(seen.ttft, 6))


def job_span(tracer: Tracer, slug: str, model: str) -> Span:
    """The INTERNAL span of one job's dispatch (a trace of its own: jobs outlive requests)."""
    if tracer is NO_TRACER:
        return NO_SPAN
    attributes: dict[str, AttributeValue] = {"gpugate.job": slug, "gen_ai.request.model": model}
    return tracer.start("dispatch job", Kind.INTERNAL, attributes)


def runtime_span(parent: Span, runtime: str, model: str) -> Span:
    """The CLIENT span of one runtime call (a submit) of a job's dispatch."""
    if not parent.recording:
        return NO_SPAN
    attributes: dict[str, AttributeValue] = {
        "gpugate.runtime": runtime,
        "gen_ai.request.model": model,
    }
    return parent.child(f"submit {runtime}", Kind.CLIENT, attributes)


def dispatch_ended(span: Span, outcome: str, runtime: str) -> None:
    """End a job's dispatch span with how it went (``dispatched`` to ``runtime``, ...)."""
    if not span.recording:
        return
    span.set("gpugate.dispatch.outcome", outcome)
    if runtime:
        span.set("gpugate.runtime", runtime)
    span.end(None if outcome in ("dispatched", "deferred") else outcome)


# -- what an answer says about itself ---------------------------------------------------------

_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d{1,12})')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d{1,12})')
_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\]{1,200})"')
#: How much of an answer's end is read for its ``usage`` (it comes last), and of its start
#: for its ``model``.
TAIL_BYTES = 4096
HEAD_BYTES = 4096


class Generation:
    """Watches one relayed answer: call :meth:`chunk` for each piece sent to the client (in
    order), then :meth:`finish` at once after the last. Copies nothing on the way: it holds the
    first piece and the last three, counts ``data:`` events, reads the clock at the first data
    event and at the end, and reads the pieces it holds at the end.

    * time to first token: from the request's arrival to the first SSE ``data:`` event sent
      (streams only; a whole JSON answer has no first token to time);
    * output tokens: ``usage.completion_tokens`` when the answer reports usage (a JSON answer,
      or a stream with ``stream_options.include_usage``), else — streams only — its data
      events but ``[DONE]`` (one token each, as vLLM and OpenAI send them); input tokens only
      from ``usage``;
    * time per output token: from the first event to the end, over the output tokens after
      the first (streams of two tokens or more).
    """

    __slots__ = ("_a", "_b", "_c", "_clock", "_events", "_first", "_head", "_started", "stream")

    def __init__(self, started: float, clock: Callable[[], float], *, stream: bool) -> None:
        self._started = started
        self._clock = clock  # read once, at the first data event; and at the end
        self.stream = stream
        self._first: float | None = None
        self._events = 0
        self._head: bytes | None = None
        self._a = self._b = self._c = b""  # the last three pieces (a usage event, then [DONE])

    def chunk(self, data: bytes) -> None:
        """One piece sent to the client; call it right after the send."""
        if self._head is None:
            self._head = data
        self._a, self._b, self._c = self._b, self._c, data
        if self.stream:
            events = data.count(b"data:")
            if events:
                if self._first is None:
                    self._first = self._clock()
                self._events += events

    def finish(
        self, *, model: bool = True, usage: tuple[int | None, int | None] | None = None
    ) -> Generated:
        """What the answer told; ``model=False`` skips looking for its ``model`` (only a
        recording span wants it). ``usage``: its prompt and completion tokens as read already
        by something that read every piece (a client key hiding a stream's usage), so the
        tail is not searched for them again."""
        ended = self._clock()  # the last event was sent just now
        last = self._c
        # the last pieces, copied only when the answer came in more than one
        tail = (
            last[-TAIL_BYTES:]
            if len(last) >= TAIL_BYTES or not (self._a or self._b)
            else ((self._a + self._b + last)[-TAIL_BYTES:])
        )
        if usage is None:
            at = tail.rfind(b'"usage"')
            found = tail[at:] if at >= 0 else b""
            prompt, completion = _first_int(_PROMPT, found), _first_int(_COMPLETION, found)
        else:
            prompt, completion = usage
        events = self._events - tail.rstrip().endswith(b"data: [DONE]")
        if completion is None and self.stream and events > 0:
            completion = events
        ttft = None if self._first is None else self._first - self._started
        tpot = None
        if self._first is not None and completion is not None and completion > 1:
            tpot = (ended - self._first) / (completion - 1)
        return Generated(ttft, tpot, prompt, completion, self._model(tail) if model else None)

    def _model(self, tail: bytes) -> str | None:
        head = (self._head or b"")[:HEAD_BYTES]
        found = _MODEL.search(head)
        if found is None and len(head) < HEAD_BYTES:  # a short first piece: the rest follows
            found = _MODEL.search(tail)
        return found.group(1).decode("utf-8", "replace") if found else None


class Generated:
    """What :class:`Generation` saw; None where the answer did not tell."""

    __slots__ = ("input_tokens", "model", "output_tokens", "time_per_output_token", "ttft")

    def __init__(
        self,
        ttft: float | None,
        time_per_output_token: float | None,
        input_tokens: int | None,
        output_tokens: int | None,
        model: str | None,
    ) -> None:
        self.ttft = ttft
        self.time_per_output_token = time_per_output_token
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.model = model

    def __repr__(self) -> str:
        return (
            f"<Generated ttft={self.ttft} tpot={self.time_per_output_token} "
            f"in={self.input_tokens} out={self.output_tokens} model={self.model!r}>"
        )


def _first_int(pattern: re.Pattern[bytes], data: bytes) -> int | None:
    found = pattern.search(data) if data else None
    return int(found.group(1)) if found is not None else None
