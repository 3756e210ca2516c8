"""The synchronous request path, written once in order:

    candidates (model → upstreams in rotation) → shed gate (batch only) → endpoints
    → choose an upstream (P2C)
    → admission (per-upstream pool, by class) → pick + claim an endpoint → send
    → on a connect failure, once more on another endpoint → a :class:`Reply` to relay.

The :class:`Reply` owns the admission slot and the endpoint claim until :meth:`Reply.aclose`,
which the web layer calls in a ``finally`` — so a client that goes away frees both at once.
Upstream responses, errors included, are passed through unchanged; our own errors are raised as
gpugate errors for the web layer to present.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gpugate.adapters.upstream_client import Timeouts, UpstreamClient, UpstreamResponse
from gpugate.clock import Clock
from gpugate.core import picking, raw_path
from gpugate.core.admission import AdmissionPool, Slot
from gpugate.core.classes import RequestClass
from gpugate.core.picking import EndpointState
from gpugate.core.registry import Registry, UpstreamState
from gpugate.errors import GpugateError, UpstreamError
from gpugate.metrics import Metrics, bounded
from gpugate.services.shed import ShedGate


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


@dataclass(slots=True, eq=False)
class Reply:
    """An upstream's response with headers in hand; the body is relayed by the caller."""

    status: int
    headers: list[tuple[bytes, bytes]]
    upstream: UpstreamState
    endpoint: EndpointState
    overhead_s: float
    _response: UpstreamResponse
    _slot: Slot
    _probe: bool
    _proxy: Proxy
    _outbound: Outbound
    _closed: bool = field(default=False)
    #: The next piece of the body as it arrives, ``b""`` at the end; raises UpstreamError on a
    #: break mid-body (then call :meth:`broke`). Bound straight to the adapter: once per chunk.
    read_chunk: Callable[[], Awaitable[bytes]] = field(init=False)
    #: Whether the whole body has been read (so the last chunk can end the response).
    at_eof: Callable[[], bool] = field(init=False)

    def __post_init__(self) -> None:
        self.read_chunk = self._response.read_chunk
        self.at_eof = self._response.at_eof

    def broke(self) -> None:
        """The upstream broke off the body: that counts against the endpoint's health."""
        picking.record_failure(self.endpoint, self._proxy.clock.monotonic())

    def close(self, code: str | None = None) -> None:
        """Release the upstream connection, the endpoint claim and the admission slot; record
        the request. ``code`` is what the client finally got (default: the upstream status)."""
        if self._closed:
            return
        self._closed = True
        self._response.release()
        picking.release(self.endpoint, probe=self._probe)
        self._slot.release()
        self._proxy.finished(self._outbound, self.upstream, code or str(self.status))


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


def _inflight(pool: AdmissionPool) -> int:
    return pool.inflight


class Proxy:
    """Forwards requests to the fleet; see the module docstring for the order of things."""

    def __init__(
        self,
        registry: Registry,
        client: UpstreamClient,
        clock: Clock,
        metrics: Metrics,
        *,
        secrets: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
        gate: ShedGate | None = None,
    ) -> None:
        self.registry = registry
        self.gate = gate
        self.clock = clock
        self._client = client
        self._metrics = metrics
        self._secrets = dict(secrets or {})
        self._rng = rng or random.Random()  # noqa: S311 - load spreading, not security
        self._counted: dict[tuple[str, str, str, str], Any] = {}  # metric children, by labels
        self._timed: dict[tuple[str, str], Any] = {}
        self.bind_gauges()

    def set_secrets(self, secrets: Mapping[str, str]) -> None:
        """Swap in the upstream credentials of a new config version (requests in flight keep
        the headers they were sent with)."""
        self._secrets = dict(secrets)

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
        """Admit, pick, send; the reply's headers have arrived when this returns.

        A connect failure (nothing reached the upstream) is retried once on another endpoint,
        of the same upstream or another serving the model; nothing else is ever retried.
        """
        upstreams = self.candidates(out)
        if self.gate is not None:  # before admission: a shed request never queues
            upstreams = self.gate.admit(upstreams, out.cls, "proxy")
        tried: set[str] = set()
        upstream_time = 0.0
        while True:
            endpoints = (
                upstreams[0].endpoints
                if len(upstreams) == 1
                else [ep for u in upstreams for ep in u.endpoints]
            )
            chosen = picking.pick(endpoints, self._rng, self.clock.monotonic(), exclude=tried)
            upstream = self.registry.owner(chosen)
            slot = upstream.pool.try_acquire() or await self._admit(upstream, out.cls)
            try:
                return await self._send(out, upstream, slot, tried, upstream_time)
            except UpstreamError as exc:
                slot.release()
                if not (
                    exc.connect_failed
                    and len(tried) == 1
                    and self._retryable(out, endpoints, tried)
                ):
                    raise
            except BaseException:
                slot.release()
                raise

    async def _admit(self, upstream: UpstreamState, cls: RequestClass) -> Slot:
        """Wait in the upstream's queue (the pool had no free slot)."""
        started = self.clock.monotonic()
        try:
            return await upstream.pool.acquire(cls, upstream.config.queue_timeout_s)
        finally:
            waited = self.clock.monotonic() - started
            self._metrics.queue_wait.labels(upstream.id, cls.value).observe(waited)

    async def _send(
        self,
        out: Outbound,
        upstream: UpstreamState,
        slot: Slot,
        tried: set[str],
        upstream_time: float,
    ) -> Reply:
        now = self.clock.monotonic()
        endpoint = picking.pick(upstream.endpoints, self._rng, now, exclude=tried)
        probe = picking.claim(endpoint, now)
        sent_at = self.clock.monotonic()
        try:
            response = await self._client.send(
                out.method,
                endpoint.url + out.path,
                self._headers(out, upstream),
                out.body,
                self._timeouts(upstream),
            )
        except UpstreamError:
            picking.release(endpoint, probe=probe)
            picking.record_failure(endpoint, self.clock.monotonic())
            tried.add(endpoint.url)
            raise
        except BaseException:
            picking.release(endpoint, probe=probe)
            raise
        ttfb = self.clock.monotonic() - sent_at
        return self._reply(
            out=out,
            upstream=upstream,
            endpoint=endpoint,
            response=response,
            slot=slot,
            probe=probe,
            ttfb=ttfb,
            upstream_time=upstream_time + ttfb,
        )

    def _reply(  # noqa: PLR0913 - one place assembles the reply from the pieces of the path
        self,
        *,
        out: Outbound,
        upstream: UpstreamState,
        endpoint: EndpointState,
        response: UpstreamResponse,
        slot: Slot,
        probe: bool,
        ttfb: float,
        upstream_time: float,
    ) -> Reply:
        now = self.clock.monotonic()
        if response.status >= 500:
            picking.record_failure(endpoint, now)
        else:
            picking.record_success(endpoint, now)
        picking.record_latency(endpoint, ttfb)
        self._metrics.upstream_ttfb.labels(upstream.id).observe(ttfb)
        overhead = max(0.0, now - out.received_at - upstream_time)
        self._metrics.overhead.observe(overhead)
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
        )

    def _retryable(self, out: Outbound, endpoints: list[EndpointState], tried: set[str]) -> bool:
        """Another endpoint is available and the body can be sent again (bytes, not a stream)."""
        if isinstance(out.body, AsyncIterator):
            return False
        now = self.clock.monotonic()
        return any(ep.url not in tried and picking.is_available(ep, now) for ep in endpoints)

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

    def _timeouts(self, upstream: UpstreamState) -> Timeouts:
        cfg = upstream.config
        first_byte = cfg.first_byte_timeout_s or cfg.timeout_s
        return Timeouts(
            connect_s=cfg.connect_timeout_s, first_byte_s=first_byte, total_s=cfg.timeout_s
        )

    def finished(self, out: Outbound, upstream: UpstreamState | None, code: str) -> None:
        """Record one finished request (the reply's, or a refusal before any reply)."""
        model = bounded(out.model or "", self.registry.configured)  # never the client's own
        key = (model, upstream.id if upstream else "", out.cls.value, code)
        counter = self._counted.get(key)
        if counter is None:
            counter = self._counted[key] = self._metrics.requests.labels(*key)
        counter.inc()
        timed = (model, out.cls.value)
        timer = self._timed.get(timed)
        if timer is None:
            timer = self._timed[timed] = self._metrics.request_duration.labels(*timed)
        timer.observe(self.clock.monotonic() - out.received_at)

    def refused(self, out: Outbound, error: GpugateError) -> None:
        """Record a request that ended with one of our errors before any upstream reply."""
        self.finished(out, None, error.code)

    def __repr__(self) -> str:
        return f"<Proxy {self.registry!r}>"
