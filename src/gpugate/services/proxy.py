"""The synchronous request path, written once in order:

    candidates (model → upstreams in rotation) → shed gate (batch only) → endpoints
    → choose an upstream (P2C)
    → admission (per-upstream pool, by class) → pick + claim an endpoint → send
    → a retryable outcome (429, 500/502/503/504, a connection that died before any response
      byte, a missed first-byte/first-token deadline, a stream whose first event is an error):
      try again — another endpoint first, after the upstream's ``Retry-After`` or a full-jitter
      backoff, within ``retry.attempts`` and the upstream's retry budget
    → the model's tries spent, or none of its endpoints in rotation: its ``fallbacks`` in order
      (``context_fallbacks`` for 400 ``context_length_exceeded``)
    → a :class:`Reply` to relay: the first answer, else the last failure as the upstream gave it.

A streamed answer is held until its first SSE data event (``first_token_timeout_s``), so a
stream that starts badly is retried before the client sees a byte; after that the stall limit
is ``stream_idle_timeout_s``. See docs/dataplane.md.

The :class:`Reply` owns the admission slot and the endpoint claim until :meth:`Reply.aclose`,
which the web layer calls in a ``finally`` — so a client that goes away frees both at once.
Upstream responses, errors included, are passed through unchanged; our own errors are raised as
gpugate errors for the web layer to present. The happy path (the first try answers) costs what
it did before: a dict lookup for the model's policy and one budget count.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from gpugate.adapters.upstream_client import Timeouts, UpstreamClient, UpstreamResponse
from gpugate.clock import Clock
from gpugate.config import ModelConfig
from gpugate.core import picking, raw_path
from gpugate.core.admission import AdmissionPool, Slot
from gpugate.core.classes import RequestClass
from gpugate.core.picking import EndpointState
from gpugate.core.registry import Registry, UpstreamState
from gpugate.core.scoring import Route, Router
from gpugate.errors import (
    GatewayOverloaded,
    GpugateError,
    NoHealthyUpstream,
    Tried,
    UpstreamError,
    UpstreamTimeout,
)
from gpugate.metrics import Metrics, bounded, incrementer, observer
from gpugate.retry import Backoff, is_load_signal, parse_retry_after, retryable
from gpugate.services.attempts import (
    KEEP_LIMIT,
    Buffered,
    Failure,
    Outcome,
    Reason,
    first_data_end,
    first_event_error,
    is_context_exceeded,
    with_model,
)
from gpugate.services.continuation import Delivered, Replay, deterministic, prefill_body
from gpugate.services.shed import ShedGate
from gpugate.telemetry import (
    NO_SPAN,
    Generated,
    Span,
    attempt_ended,
    attempt_span,
    fallback_span,
    traced,
)

log = logging.getLogger("gpugate.proxy")

#: The longest an endpoint is backed off for one ``Retry-After`` (a bogus huge value is capped).
MAX_ENDPOINT_BACKOFF_S = 60.0
#: A 429/503 without ``Retry-After`` backs its endpoint off 1 s, doubling per signal in a row up
#: to 8 s: long enough that the next requests go elsewhere, short enough that a recovered
#: endpoint gets traffic back well within 10 s.
LOAD_BACKOFF_S = 1.0
MAX_LOAD_BACKOFF_S = 8.0
_EVENT_STREAM = b"text/event-stream"
_MADE_AT_MOST = 4096  # entries of the per-config caches before they start again


@dataclass(frozen=True, slots=True)
class Outbound:
    """A request to forward: where to (a model or one named upstream) and what to send."""

    method: str
    path: str  # path and query as the upstream should see them
    headers: list[tuple[bytes, bytes]]
    body: bytes | AsyncIterator[bytes] | None
    cls: RequestClass
    received_at: float  # clock.monotonic() when the request arrived
    model: str | None = None
    upstream_id: str | None = None
    #: The request body parsed once by the data plane (a JSON object), or None when it was not
    #: parsed (raw pass-through, a streamed body). Read it; never parse ``body`` again.
    doc: dict[str, Any] | None = None
    #: ``/u/{upstream}/{path}``: checked against the upstream's ``raw:`` opt-in, and sent
    #: without the upstream's key unless ``raw.send_key`` (issue #15 finding 1).
    raw: bool = False
    #: ``"stream": true``: the answer is an SSE stream (held until its first data event).
    stream: bool = False
    #: A fallback model may be served by an ``external`` upstream (jobs: ``allow_external``).
    allow_external: bool = False
    #: False: no waiting retry and no fallback — the caller retries itself (the job dispatcher
    #: walks its runtimes and counts attempts); only a fresh, calm peer endpoint is tried at once
    #: after a failure (#14.2: a busy endpoint must not fail the job while its peer is healthy).
    rescue: bool = True
    #: The request's span (:mod:`gpugate.telemetry`): attempts and fallbacks are its children.
    span: Span = NO_SPAN


@dataclass(slots=True, eq=False)
class Reply:
    """An upstream's response with headers in hand; the body is relayed by the caller."""

    status: int
    headers: list[tuple[bytes, bytes]]
    upstream: UpstreamState
    endpoint: EndpointState
    overhead_s: float
    _response: UpstreamResponse | Buffered
    _slot: Slot | None  # None: a kept failure whose slot and claim were released already
    _probe: bool
    _proxy: Proxy
    _outbound: Outbound
    _closed: bool = field(default=False)
    #: The model that answered (after any fallback) and the tries it took in all.
    model: str | None = None
    attempts: int = 1
    #: Body pieces read already (a stream's first event, held with the headers).
    _held: list[bytes] = field(default_factory=list)
    #: The next piece of the body as it arrives, ``b""`` at the end; raises UpstreamError on a
    #: break mid-body (then call :meth:`broke`). Bound straight to the adapter: once per chunk.
    read_chunk: Callable[[], Awaitable[bytes]] = field(init=False)
    #: Whether the whole body has been read (so the last chunk can end the response).
    at_eof: Callable[[], bool] = field(init=False)

    def __post_init__(self) -> None:
        if self._held:
            self.read_chunk = self._read_held
            self.at_eof = self._held_at_eof
        else:
            self.read_chunk = self._response.read_chunk
            self.at_eof = self._response.at_eof

    async def _read_held(self) -> bytes:
        if self._held:
            chunk = self._held.pop(0)
            if not self._held:  # from now on straight from the adapter
                self.read_chunk = self._response.read_chunk
                self.at_eof = self._response.at_eof
            return chunk
        return await self._response.read_chunk()

    def _held_at_eof(self) -> bool:
        return not self._held and self._response.at_eof()

    def broke(self) -> None:
        """The upstream broke off the body: that counts against the endpoint's health."""
        picking.record_failure(self.endpoint, self._proxy.clock.monotonic())

    def discard(self) -> None:
        """Release everything without recording a request (a continuation's try that was not
        used: the request is recorded once, by the reply that ends it)."""
        if self._closed:
            return
        self._closed = True
        self._response.release()
        if self._slot is not None:
            picking.release(self.endpoint, probe=self._probe)
            self._slot.release()

    def close(self, code: str | None = None) -> None:
        """Release the upstream connection, the endpoint claim and the admission slot; record
        the request. ``code`` is what the client finally got (default: the upstream status)."""
        if self._closed:
            return
        self.discard()
        self._proxy.finished(self._outbound, self.upstream.id, code or str(self.status))


async def read_all(reply: Reply) -> bytes:
    """The reply's whole body; UpstreamError on a break mid-body (the caller then calls
    :meth:`Reply.broke` and closes the reply with the error's code)."""
    parts = []
    while chunk := await reply.read_chunk():
        parts.append(chunk)
    return b"".join(parts)


def json_or_text(body: bytes) -> Any:
    """A body as JSON, else as text (undecodable bytes replaced)."""
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", errors="replace")


_CREDENTIALS = frozenset({b"authorization", b"ocp-apim-subscription-key"})


def endpoint_label(upstream: UpstreamState, endpoint: EndpointState) -> str:
    """How errors and open metrics name an endpoint: its upstream's id and its place in the
    upstream's ``urls``, never the URL (issue #15 finding 8; ``/admin/upstreams`` has them)."""
    if len(upstream.endpoints) == 1:
        return f"upstream {upstream.id!r}"
    return f"upstream {upstream.id!r} endpoint {upstream.endpoints.index(endpoint)}"


def _inflight(pool: AdmissionPool) -> int:
    return pool.inflight


class Proxy:
    """Forwards requests to the fleet; see the module docstring for the order of things."""

    def __init__(  # noqa: PLR0913 - collaborators, then keyword-only knobs
        self,
        registry: Registry,
        client: UpstreamClient,
        clock: Clock,
        metrics: Metrics,
        *,
        secrets: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
        gate: ShedGate | None = None,
        models: Sequence[ModelConfig] = (),
        router: Router | None = None,
    ) -> None:
        self.registry = registry
        self.gate = gate
        #: The engine-aware picker; None: wave 1's power of two choices (docs/routing.md).
        self.router = router
        self.clock = clock
        self._client = client
        self._metrics = metrics
        self._secrets = dict(secrets or {})
        self._rng = rng or random.Random()  # noqa: S311 - load spreading, not security
        self._counted: dict[tuple[str, str, RequestClass, str], Any] = {}  # metric children
        self._attempt_counters: dict[tuple[str, Outcome], Any] = {}
        self._models: dict[str, ModelConfig] = {m.name: m for m in models}
        self._timed: dict[tuple[str, RequestClass], Callable[[float], None]] = {}
        self._picked: dict[tuple[str, str], Any] = {}
        self._generation: dict[tuple[str, str], Callable[[float], None]] = {}  # GenAI histograms
        self._ttfb: dict[str, Callable[[float], None]] = {}  # upstream_ttfb's, by upstream id
        self._overhead = observer(metrics.overhead)
        #: Per attempt, made once per upstream config and endpoint (bounded: cleared when the
        #: fleet has changed enough to fill it): the deadlines, and how errors name the endpoint.
        self._deadlines: dict[tuple[int, bool], tuple[object, Timeouts]] = {}
        self._labels: dict[int, tuple[EndpointState, UpstreamState, str]] = {}
        self.bind_gauges()

    def set_secrets(self, secrets: Mapping[str, str]) -> None:
        """Swap in the upstream credentials of a new config version (requests in flight keep
        the headers they were sent with)."""
        self._secrets = dict(secrets)

    def set_models(self, models: Sequence[ModelConfig]) -> None:
        """Swap in the ``models[]`` policy (fallbacks) of a new config version; a fallback no
        upstream serves is logged here and passed over by the walk."""
        self._models = {m.name: m for m in models}
        for name in sorted({f for m in models for f in (*m.fallbacks, *m.context_fallbacks)}):
            if not self.registry.serves(name):
                log.warning("no upstream serves the fallback model %r: the walk skips it", name)

    def bind_gauges(self) -> None:
        """In-flight and queue-depth gauges read the pools when scraped, not on every request."""
        m = self._metrics
        for upstream in self.registry.upstreams():
            pool = upstream.pool
            m.upstream_inflight.labels(upstream.id).set_function(partial(_inflight, pool))
            for cls in RequestClass:
                depth = m.queue_depth.labels(upstream.id, cls.value)
                depth.set_function(partial(pool.queued_in, cls))

    def candidates(self, out: Outbound) -> Sequence[UpstreamState]:
        """The upstreams this request may go to (raises UnknownModel/UnknownUpstream/...)."""
        if out.upstream_id is not None:
            upstreams = [self.registry.upstream(out.upstream_id)]
            if out.raw:
                raw_path.check_allowed(upstreams[0].config, out.method, out.path)
        else:
            assert out.model is not None
            upstreams = self.registry.serving(out.model)
        return self.registry.in_rotation(upstreams)

    async def open(self, out: Outbound) -> Reply:
        """Admit, pick, send, try again, fall back; the reply's headers (and for a stream its
        first data event) have arrived when this returns. See the module docstring."""
        run = _Run(out)
        policy = self._models.get(out.model) if out.model is not None else None
        if policy is None or out.upstream_id is not None or not out.rescue:
            reply = await self._try_model(run, out, last=True)
            return reply if reply is not None else self._give_up(run)
        return await self._walk(run, out, policy)

    async def _walk(self, run: _Run, out: Outbound, policy: ModelConfig) -> Reply:
        """The model, then its fallbacks in order (context fallbacks on a too-long prompt)."""
        serves = self.registry.serves  # a fallback no upstream serves is passed over
        chain: list[str] = [policy.name, *filter(serves, policy.fallbacks)]
        context_used = False
        i = 0
        while i < len(chain):
            name = chain[i]
            target = out if name == out.model else self._for_model(out, name)
            if i:  # a hop: its tries are the hop span's children
                run.parent = fallback_span(out.span, policy.name, name, run.reason.value)
            reply = await self._try_model(run, target, last=i == len(chain) - 1, hop=i)
            if i:
                run.parent.end(None if reply is not None else run.outcome)
            if reply is not None:
                return reply
            if run.context is not None and not context_used and policy.context_fallbacks:
                context_used = True  # the prompt is too long: only the long-context models
                chain = [name, *filter(serves, policy.context_fallbacks)]
                run.reason = Reason.CONTEXT
            elif run.context is not None:
                return self._give_up(run)
            i += 1
            if i < len(chain):
                self._metrics.fallbacks.labels(policy.name, chain[i], run.reason.value).inc()
        return self._give_up(run)

    async def continue_stream(
        self, out: Outbound, done: Delivered
    ) -> tuple[Reply, Replay | None] | None:
        """A stream of ``out`` broke after ``done`` reached the client: a reply that continues
        it (and the filter a replay needs), or None when no target can do so faithfully.

        Targets in order: the model's own upstreams, then its fallbacks'; each by its
        ``continuation`` (``replay`` only for the same model and a deterministic request,
        ``prefill`` for any). A target's refusal (a 4xx, a failure) is skipped silently.
        """
        doc = out.doc
        if doc is None or out.model is None or done.finished:
            return None
        policy = self._models.get(out.model)
        chain = [out.model, *(policy.fallbacks if policy is not None else ())]
        same_again = deterministic(doc) and isinstance(out.body, bytes)
        for hop, name in enumerate(chain):
            try:
                upstreams = self.candidates(dataclasses.replace(out, model=name))
            except GpugateError:
                continue
            for upstream in upstreams:
                mode = upstream.config.continuation
                if hop and upstream.config.external and not out.allow_external:
                    continue
                if mode == "replay" and (hop or not same_again):
                    continue
                if mode == "none":
                    continue
                body = out.body if mode == "replay" else prefill_body(doc, name, done.text)
                target = dataclasses.replace(
                    out, model=name, upstream_id=upstream.id, body=body, doc=None
                )
                try:
                    reply = await self._try_model(_Run(target), target, last=True)
                except GpugateError:
                    continue
                if reply is None:
                    continue
                if reply.status != 200 or not _is_event_stream(reply.headers):
                    reply.discard()  # e.g. a 400 refusing the prefill: never the client's story
                    continue
                self._metrics.continuations.labels(out.model, mode).inc()
                if hop:
                    self._metrics.fallbacks.labels(out.model, name, Reason.STREAM_BROKE).inc()
                return reply, Replay(done.text) if mode == "replay" else None
        self._metrics.continuations.labels(out.model, "failed").inc()
        return None

    def _give_up(self, run: _Run) -> Reply:
        """Nothing answered: relay the failure kept (an upstream's own response, as it gave
        it), or raise our error."""
        failure = run.context or run.last
        if failure is None:
            raise NoHealthyUpstream("no endpoint serves this request")
        now = self.clock.monotonic()
        overhead = max(0.0, now - run.out.received_at - run.upstream_time - run.waited)
        kept = failure.kept
        if kept is None:
            error = failure.error
            assert error is not None
            if failure.upstream is not None:  # the answer and its count name the one tried
                error.tried = Tried(failure.upstream.id, run.attempts, overhead)
            raise error
        headers = kept.headers
        if is_load_signal(kept.status) and not _has_retry_after(headers):
            headers = [*headers, (b"retry-after", _retry_after(failure.endpoint, now))]
        return Reply(
            kept.status,
            headers,
            failure.upstream,
            failure.endpoint,
            overhead,
            kept,
            None,
            False,  # noqa: FBT003 - Reply's positional fields
            self,
            run.out,
            model=failure.model,
            attempts=run.attempts,
        )

    def _for_model(self, out: Outbound, model: str) -> Outbound:
        """``out`` sent to a fallback model: the body's ``model`` rewritten."""
        assert isinstance(out.body, bytes)
        return dataclasses.replace(out, model=model, body=with_model(out.doc, out.body, model))

    async def _try_model(  # noqa: C901, PLR0911, PLR0912, PLR0915 - the retry rules, in order
        self, run: _Run, out: Outbound, *, last: bool, hop: int = 0
    ) -> Reply | None:
        """Try ``out``'s model (or its one named upstream) up to its upstreams' ``retry``
        rules; the reply to relay, or None when every try failed (``run`` keeps why)."""
        try:
            upstreams = self.candidates(out)
        except NoHealthyUpstream as exc:  # the whole model is out: the next one, at once
            run.fail(Failure(Outcome.BUSY_ENDPOINT, error=exc), Reason.OUT_OF_ROTATION)
            return None
        if hop and not out.allow_external:
            upstreams = [u for u in upstreams if not u.config.external]
        if self.gate is not None:  # before admission: a shed request never queues
            upstreams = self.gate.admit(upstreams, out.cls, "proxy")
        endpoints = (
            upstreams[0].endpoints
            if len(upstreams) == 1
            else [ep for u in upstreams for ep in u.endpoints]
        )
        resendable = out.body is None or isinstance(out.body, bytes)  # not the ABC's check
        tried: set[str] = set()
        tries = 0
        slept = False
        refused_again = False  # the one try past ``attempts`` a refused connect is owed
        route = self._route(out, endpoints)
        reason = "p2c"
        while True:
            now = self.clock.monotonic()
            try:
                chosen, reason = self._pick(route, endpoints, tried)
            except NoHealthyUpstream as exc:
                silent = run.silent or ()  # a timeout is retried on an endpoint not tried only
                again = (
                    tries and run.last is not None and any(ep.url not in silent for ep in endpoints)
                )
                if not again:  # nothing (left) to try: out of rotation, or every one timed out
                    if tries == 0 and last and not hop and run.last is None:
                        raise
                    run.fail(Failure(Outcome.BUSY_ENDPOINT, error=exc), Reason.OUT_OF_ROTATION)
                    return None
                try:  # one tried already, again (never one that timed out)
                    chosen = picking.pick(endpoints, self._rng, now, exclude=silent)
                except NoHealthyUpstream as again_exc:
                    run.fail(Failure(Outcome.BUSY_ENDPOINT, error=again_exc), Reason.FAILED)
                    return None
            upstream = self.registry.owner(chosen)
            retry = upstream.config.retry
            if tries == 0:
                upstream.budget.note_request(now)
                if not last and picking.is_backed_off(chosen, now):
                    error = NoHealthyUpstream(f"every endpoint of {out.model} asked to back off")
                    run.fail(Failure(Outcome.BUSY_ENDPOINT, error=error), Reason.BUSY)
                    return None
            elif not slept:
                if not resendable:
                    return None
                if tries >= retry.attempts:
                    # DESIGN §3: a refused connect is retried once on another endpoint, even
                    # with ``attempts: 1`` (the upstream never saw it)
                    if refused_again or run.outcome != Outcome.CONNECT or chosen.url in tried:
                        return None
                    refused_again = True
                if not out.rescue and (chosen.url in tried or picking.is_backed_off(chosen, now)):
                    return None  # the caller retries itself: only a fresh peer, at once
                wait, asked = self._wait(chosen, tried, tries, now, upstream)
                if asked and wait > retry.retry_after_max_s:
                    return None  # asked to wait longer than we may: the next model, or the client
                if not self._budget_allows(run, upstream, now):
                    return None
                if wait > 0:
                    await self.clock.sleep(wait)
                    run.waited += wait
                    slept = True
                    continue  # pick again: the fleet may have changed while we waited
            slept = False
            tries += 1
            run.attempts += 1
            slot = upstream.pool.try_acquire() or await self._admit(upstream, out.cls)
            attempt = attempt_span(run.parent, out.path, out.model, upstream.config, tries)
            try:
                reply = await self._send(
                    run,
                    out,
                    upstream,
                    slot,
                    chosen,
                    tried,
                    route=route,
                    reason=reason,
                    attempt=attempt,
                )
            except BaseException as exc:
                slot.release()
                attempt.end(type(exc).__name__)
                raise
            if reply is not None:
                ok = reply.status < 400
                attempt_ended(attempt, Outcome.OK if ok else Outcome.CLIENT_ERROR, reply.status)
                return reply
            attempt_ended(attempt, run.outcome)
            if run.context is not None:  # a 400 "too long": never retried on the same model
                return None

    @staticmethod
    def _budget_allows(run: _Run, upstream: UpstreamState, now: float) -> bool:
        """A refused connect cost the upstream nothing: free. Any other retry spends budget."""
        if run.last is not None and run.last.outcome is Outcome.CONNECT:
            return True
        return upstream.budget.try_spend(now)

    def _wait(
        self,
        chosen: EndpointState,
        tried: set[str],
        tries: int,
        now: float,
        upstream: UpstreamState,
    ) -> tuple[float, bool]:
        """How long to wait before the next try on ``chosen``, and whether the endpoint asked
        for it: its own ``Retry-After`` while that runs; none for a fresh calm endpoint; else a
        full-jitter backoff within ``max_backoff_s`` (the gateway's own load backoff of a 429 or
        503 without ``Retry-After`` steers the picks, it never stretches a retry's wait)."""
        if chosen.asked_until > now:
            return chosen.asked_until - now, True
        fresh = chosen.url not in tried
        if fresh and chosen.backoff_until <= now:
            return 0.0, False
        retry = upstream.config.retry
        delay = Backoff(retry.backoff_s, retry.max_backoff_s, self._rng).delay(tries)
        return (min(delay, chosen.backoff_until - now) if fresh else delay), False

    def _route(self, out: Outbound, endpoints: Sequence[EndpointState]) -> Route | None:
        """The request's routing facts (prompt hashed once), when a router routes models and
        there is a choice to make (one endpoint: nothing to hash, nothing to learn)."""
        if self.router is None or out.model is None or len(endpoints) < 2:
            return None
        batch = out.cls is RequestClass.BATCH
        return self.router.route(out.model, out.upstream_id, out.doc, out.headers, batch=batch)

    def _picks(self, policy: str, reason: str) -> Any:
        child = self._picked.get((policy, reason))
        if child is None:
            child = self._picked[policy, reason] = incrementer(
                self._metrics.routing_picks.labels(policy, reason)
            )
        return child

    def _pick(
        self, route: Route | None, endpoints: Sequence[EndpointState], tried: set[str]
    ) -> tuple[EndpointState, str]:
        now = self.clock.monotonic()
        if route is None or self.router is None:
            return picking.pick(endpoints, self._rng, now, exclude=tried), "p2c"
        for backed_off in endpoints:  # a loop, not any() over a generator, per pick
            if backed_off.backoff_until > now:  # #14.2 under every policy too
                calm = [
                    ep
                    for ep in endpoints
                    if ep.backoff_until <= now
                    and ep.url not in tried
                    and picking.is_available(ep, now)
                ]
                endpoints = calm or endpoints
                break
        return self.router.pick(route, endpoints, self._rng, now, exclude=tried)

    async def _admit(self, upstream: UpstreamState, cls: RequestClass) -> Slot:
        """Wait in the upstream's queue (the pool had no free slot)."""
        started = self.clock.monotonic()
        try:
            return await upstream.pool.acquire(cls, upstream.config.queue_timeout_s)
        finally:
            waited = self.clock.monotonic() - started
            self._metrics.queue_wait.labels(upstream.id, cls.value).observe(waited)

    async def _send(  # noqa: PLR0913, PLR0915 - one try, every way it can end
        self,
        run: _Run,
        out: Outbound,
        upstream: UpstreamState,
        slot: Slot,
        endpoint: EndpointState,
        tried: set[str],
        *,
        route: Route | None = None,
        reason: str = "p2c",
        attempt: Span = NO_SPAN,
    ) -> Reply | None:
        """One try on ``endpoint``: the reply to relay, or None (recorded in ``run``) when it
        failed in a way worth another try. The slot is released on failure, kept by the reply
        otherwise."""
        now = self.clock.monotonic()
        if not picking.is_available(endpoint, now):  # it changed while we queued for a slot
            endpoint = picking.pick(upstream.endpoints, self._rng, now)
        probe = picking.claim(endpoint, now)
        tried.add(endpoint.url)
        if route is not None and self.router is not None:
            self.router.sent(route, endpoint)
            self._picks(route.policy, reason)()
        sent_at = self.clock.monotonic()
        cfg = upstream.config
        headers = traced(attempt, self._headers(out, upstream), upstream.endpoints, endpoint)
        try:
            response = await self._client.send(
                out.method,
                endpoint.url + out.path,
                headers,
                out.body,
                self._timeouts(upstream, stream=out.stream),
                label=self._label(upstream, endpoint),  # clients read the id, not the URL
            )
        except UpstreamError as exc:
            now = self.clock.monotonic()
            run.upstream_time += now - sent_at
            picking.release(endpoint, probe=probe)
            picking.record_failure(endpoint, now)
            slot.release()
            outcome = (
                Outcome.CONNECT
                if exc.connect_failed
                else Outcome.TIMEOUT
                if isinstance(exc, UpstreamTimeout)
                else Outcome.DROPPED
            )
            self._count(upstream, outcome)
            failure = Failure(outcome, error=exc, upstream=upstream, endpoint=endpoint)
            run.fail(failure, Reason.FAILED)
            return None
        except GatewayOverloaded:
            picking.release(endpoint, probe=probe)
            self._metrics.overloaded.labels("file_descriptors").inc()
            raise
        except BaseException:
            picking.release(endpoint, probe=probe)
            raise
        ttfb = self.clock.monotonic() - sent_at
        status = response.status
        held: list[bytes] = []
        try:
            if retryable(status):
                await self._failed_status(run, out, upstream, endpoint, response)
                run.upstream_time += self.clock.monotonic() - sent_at
                picking.release(endpoint, probe=probe)
                slot.release()
                return None
            if status == 400 and run.wants_context(self._models, out.model):
                read: list[bytes] = []
                body = await _read_kept(response, read)
                if body is not None and is_context_exceeded(body):
                    picking.record_success(endpoint, self.clock.monotonic())
                    response.release()
                    picking.release(endpoint, probe=probe)
                    slot.release()
                    self._count(upstream, Outcome.CONTEXT)
                    kept = Buffered(status, response.headers, body)
                    run.context = Failure(
                        Outcome.CONTEXT, kept, None, upstream, endpoint, out.model
                    )
                    run.fail(run.context, Reason.CONTEXT)
                    run.upstream_time += self.clock.monotonic() - sent_at
                    return None
                held = read  # relayed as it came, whatever was read of it
            elif out.stream and status == 200 and _is_event_stream(response.headers):
                held = await self._first_event(response, cfg.first_token_timeout_s, ttfb)
                response.set_idle_timeout(cfg.stream_idle_timeout_s)
        except UpstreamError as exc:
            now = self.clock.monotonic()
            run.upstream_time += now - sent_at
            response.release()
            picking.release(endpoint, probe=probe)
            picking.record_failure(endpoint, now)
            slot.release()
            outcome = Outcome.TIMEOUT if isinstance(exc, UpstreamTimeout) else Outcome.BAD_START
            self._count(upstream, outcome)
            failure = Failure(outcome, error=exc, upstream=upstream, endpoint=endpoint)
            run.fail(failure, Reason.FAILED)
            return None
        except BaseException:
            response.release()
            picking.release(endpoint, probe=probe)
            raise
        self._count(upstream, Outcome.OK if status < 400 else Outcome.CLIENT_ERROR)
        return self._reply(
            run=run,
            out=out,
            upstream=upstream,
            endpoint=endpoint,
            response=response,
            slot=slot,
            probe=probe,
            ttfb=ttfb,
            held=held,
        )

    async def _failed_status(
        self,
        run: _Run,
        out: Outbound,
        upstream: UpstreamState,
        endpoint: EndpointState,
        response: UpstreamResponse,
    ) -> None:
        """A 429/5xx: back the endpoint off (a load signal) or count a failure, and keep the
        response whole for the client in case no later try answers."""
        now = self.clock.monotonic()
        status = response.status
        retry_after = None
        for name, value in response.headers:
            if name == b"retry-after":
                retry_after = parse_retry_after(value, datetime.now(UTC))
                break
        wait = None if retry_after is None else min(retry_after, MAX_ENDPOINT_BACKOFF_S)
        # what the endpoint asked for in this answer (nothing: 0): a retry there waits it
        endpoint.asked_until = 0.0 if wait is None else now + wait
        if is_load_signal(status):
            picking.record_load_signal(
                endpoint, now, wait, base_s=LOAD_BACKOFF_S, max_s=MAX_LOAD_BACKOFF_S
            )
            outcome = Outcome.RATE_LIMITED if status == 429 else Outcome.BUSY
        else:
            picking.record_failure(endpoint, now)
            if wait is not None:
                endpoint.backoff_until = endpoint.asked_until
            outcome = Outcome.SERVER_ERROR
        self._count(upstream, outcome)
        try:
            body = await _read_kept(response)
        except UpstreamError:
            body = b""
        finally:
            response.release()
        kept = Buffered(status, response.headers, body or b"")
        run.fail(Failure(outcome, kept, None, upstream, endpoint, out.model), Reason.FAILED)

    async def _first_event(
        self, response: UpstreamResponse, timeout_s: float, spent_s: float
    ) -> list[bytes]:
        """Read a stream up to its first complete data event within what is left of
        ``timeout_s``; the pieces read. :class:`UpstreamError` when the stream ends, breaks,
        stays silent or opens with an error event: a bad start, retried invisibly."""
        held: list[bytes] = []
        buffer = b""
        # the response's own timer, and none when the event came with the head (no Timeout)
        deadline = asyncio.get_running_loop().time() + max(0.0, timeout_s - spent_s)
        while True:
            try:
                chunk = await response.read_chunk_by(deadline)
            except UpstreamTimeout as exc:
                raise UpstreamTimeout(
                    f"the upstream sent no first event within {timeout_s:g} s"
                ) from exc
            if not chunk:
                raise UpstreamError("the upstream's stream ended before its first event")
            held.append(chunk)
            buffer = buffer + chunk if buffer else chunk
            if b"\r" in buffer:  # CRLF framing: find the event as LF
                buffer = buffer.replace(b"\r\n", b"\n")
            end = first_data_end(buffer)
            if end >= 0:
                break
            if len(buffer) > KEEP_LIMIT:
                raise UpstreamError("the upstream's stream sent no data event")
        if first_event_error(buffer[:end]):
            raise UpstreamError("the upstream's stream opened with an error event")
        return held

    def _count(self, upstream: UpstreamState, outcome: Outcome) -> None:
        # the enum member, not its value (two calls in 3.11), and the id from the config,
        # not UpstreamState's property (one)
        key = (upstream.id, outcome)
        counter = self._attempt_counters.get(key)
        if counter is None:
            counter = self._attempt_counters[key] = incrementer(
                self._metrics.upstream_attempts.labels(upstream.id, outcome.value)
            )
        counter()

    def _reply(  # noqa: PLR0913 - one place assembles the reply from the pieces of the path
        self,
        *,
        run: _Run,
        out: Outbound,
        upstream: UpstreamState,
        endpoint: EndpointState,
        response: UpstreamResponse,
        slot: Slot,
        probe: bool,
        ttfb: float,
        held: list[bytes],
    ) -> Reply:
        now = self.clock.monotonic()
        picking.record_success(endpoint, now)
        if response.status < 400:
            picking.record_latency(endpoint, ttfb, now=now)
        timer = self._ttfb.get(upstream.id)
        if timer is None:
            timer = self._ttfb[upstream.id] = observer(
                self._metrics.upstream_ttfb.labels(upstream.id)
            )
        timer(ttfb)
        run.upstream_time += ttfb
        overhead = max(0.0, now - out.received_at - run.upstream_time - run.waited)
        self._overhead(overhead)
        if run.attempts > 1:
            log.info(
                "%s answered by %s after attempts=%d (model %s)",
                out.path,
                upstream.id,
                run.attempts,
                out.model,
            )
        return Reply(
            response.status,
            response.headers,
            upstream,
            endpoint,
            overhead,
            response,
            slot,
            probe,
            self,
            out,
            model=out.model,
            attempts=run.attempts,
            _held=held,
        )

    def _headers(self, out: Outbound, upstream: UpstreamState) -> list[tuple[bytes, bytes]]:
        """The client's headers, with the upstream's key (if it has one) in place of any
        credential the client sent: ``Authorization: Bearer`` for OpenAI-compatible servers,
        ``Ocp-Apim-Subscription-Key`` for Azure Document Intelligence."""
        key_env = upstream.config.api_key_env
        if key_env is None or (out.raw and not raw_path.sends_key(upstream.config)):
            return out.headers
        key = self._secrets.get(key_env, "").encode()
        headers = [(k, v) for k, v in out.headers if k.lower() not in _CREDENTIALS]
        if upstream.config.kind == "azure-di":
            headers.append((b"ocp-apim-subscription-key", key))
        else:
            headers.append((b"authorization", b"Bearer " + key))
        return headers

    def _timeouts(self, upstream: UpstreamState, *, stream: bool) -> Timeouts:
        cfg = upstream.config
        made = self._deadlines.get((id(cfg), stream))
        if made is not None and made[0] is cfg:
            return made[1]
        if len(self._deadlines) > _MADE_AT_MOST:
            self._deadlines.clear()
        timeouts = self._make_timeouts(upstream, stream=stream)
        self._deadlines[id(cfg), stream] = (cfg, timeouts)
        return timeouts

    def _label(self, upstream: UpstreamState, endpoint: EndpointState) -> str:
        made = self._labels.get(id(endpoint))
        if made is not None and made[0] is endpoint and made[1] is upstream:
            return made[2]
        if len(self._labels) > _MADE_AT_MOST:
            self._labels.clear()
        label = endpoint_label(upstream, endpoint)
        self._labels[id(endpoint)] = (endpoint, upstream, label)
        return label

    @staticmethod
    def _make_timeouts(upstream: UpstreamState, *, stream: bool) -> Timeouts:
        cfg = upstream.config
        if stream:  # the first event's deadline also bounds the headers
            first_byte = cfg.first_token_timeout_s
        else:
            first_byte = cfg.first_byte_timeout_s or cfg.timeout_s
        return Timeouts(
            connect_s=cfg.connect_timeout_s,
            first_byte_s=min(first_byte, cfg.timeout_s),
            total_s=cfg.timeout_s,
        )

    def finished(self, out: Outbound, upstream: str, code: str) -> None:
        """Record one finished request (the reply's, or a refusal: ``upstream`` the last one
        tried, ``""`` when none was)."""
        model = bounded(out.model or "", self.registry.configured)  # never the client's own
        cls = out.cls  # the member in the keys, its value only in a new child's labels
        key = (model, upstream, cls, code)
        counter = self._counted.get(key)
        if counter is None:
            child = self._metrics.requests.labels(key[0], key[1], cls.value, code)
            counter = self._counted[key] = incrementer(child)
        counter()
        timed = (model, cls)
        timer = self._timed.get(timed)
        if timer is None:
            timer = self._timed[timed] = observer(
                self._metrics.request_duration.labels(model, cls.value)
            )
        timer(self.clock.monotonic() - out.received_at)

    def generated(self, out: Outbound, reply: Reply, seen: Generated) -> None:
        """Record what a finished answer told of its generation (TTFT, time per output token,
        tokens; :class:`gpugate.telemetry.Generation`), by the model that answered."""
        model = bounded(reply.model or out.model or "", self.registry.configured)
        for kind, value in (
            ("ttft", seen.ttft),
            ("tpot", seen.time_per_output_token),
            ("input", seen.input_tokens),
            ("output", seen.output_tokens),
        ):
            if value is not None:
                timer = self._generation.get((model, kind))
                if timer is None:
                    timer = self._generation[model, kind] = observer(
                        self._generation_child(model, kind)
                    )
                timer(value)

    def _generation_child(self, model: str, kind: str) -> Any:
        m = self._metrics
        if kind == "ttft":
            return m.time_to_first_token.labels(model)
        if kind == "tpot":
            return m.time_per_output_token.labels(model)
        return m.tokens_per_request.labels(model, kind)

    def refused(self, out: Outbound, error: GpugateError) -> None:
        """Record a request that ended with one of our errors before any upstream reply."""
        tried = error.tried
        self.finished(out, "" if tried is None else tried.upstream, error.code)

    def __repr__(self) -> str:
        return f"<Proxy {self.registry!r}>"


def _has_retry_after(headers: list[tuple[bytes, bytes]]) -> bool:
    for k, _ in headers:  # noqa: SIM110 - like _is_event_stream
        if k == b"retry-after":
            return True
    return False


def _retry_after(endpoint: EndpointState, now: float) -> bytes:
    """``Retry-After`` for a 429/503 relayed without one: when the gateway will send to the
    endpoint that gave it again (its remaining load backoff), in whole seconds, at least 1."""
    return str(max(1, math.ceil(endpoint.backoff_until - now))).encode()


def _is_event_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    for k, v in headers:  # noqa: SIM110 - not any() over a generator: no frame resumed per header
        if k == b"content-type" and v.startswith(_EVENT_STREAM):
            return True
    return False


async def _read_kept(response: UpstreamResponse, parts: list[bytes] | None = None) -> bytes | None:
    """A failed try's body, whole, if it is at most :data:`KEEP_LIMIT` bytes; None if longer
    (then it is not kept, and ``parts``, when given, holds what was read of it)."""
    parts = [] if parts is None else parts
    size = 0
    while chunk := await response.read_chunk():
        size += len(chunk)
        parts.append(chunk)
        if size > KEEP_LIMIT:
            return None
    return b"".join(parts)


@dataclass(slots=True, eq=False)
class _Run:
    """One request's tries across models: how many, how long, and the failure to report if
    nothing answers (the most telling one: an upstream's own answer beats our error)."""

    out: Outbound
    attempts: int = 0
    upstream_time: float = 0.0
    waited: float = 0.0
    last: Failure | None = None
    reason: Reason = Reason.FAILED
    context: Failure | None = None  # a 400 context_length_exceeded, when one came
    #: The span the next tries are children of: the request's, or a fallback hop's.
    parent: Span = NO_SPAN
    outcome: str = ""  # how the latest failed try ended (its span's status)
    #: The endpoints that timed out for this request (None until one does): never again.
    silent: set[str] | None = None

    def __post_init__(self) -> None:
        self.parent = self.out.span

    def fail(self, failure: Failure, reason: Reason) -> None:
        self.outcome = failure.outcome.value
        if failure.outcome is Outcome.TIMEOUT and failure.endpoint is not None:
            if self.silent is None:
                self.silent = set()
            self.silent.add(failure.endpoint.url)
        if failure.outcome is Outcome.BUSY_ENDPOINT and self.last is not None:
            self.reason = reason  # "nothing left to try" adds nothing to a real failure
            return
        if failure.kept is None and self.last is not None and self.last.kept is not None:
            self.reason = reason  # keep the upstream's own answer; remember why we moved on
            return
        if self.context is not None and failure is not self.context:
            self.reason = reason  # the first real story: the prompt is too long
            return
        self.last = failure
        self.reason = reason

    def wants_context(self, models: Mapping[str, ModelConfig], model: str | None) -> bool:
        """Whether a 400 should be read for ``context_length_exceeded``: the request's own
        model has context fallbacks (and none was tried yet)."""
        policy = models.get(self.out.model) if self.out.model is not None else None
        return (
            policy is not None
            and bool(policy.context_fallbacks)
            and model == self.out.model
            and self.context is None
        )
