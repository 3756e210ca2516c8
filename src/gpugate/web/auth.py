"""Client keys at the door (``auth.mode: keys``): who is calling, what the key allows, its limits,
and the usage its responses report.

:class:`ClientKeys` is ASGI middleware around the data plane. With ``auth.mode: open`` it passes
every request through untouched. With ``keys``, on the data-plane routes it

1. authenticates the key (``Authorization: Bearer``, ``api-key``, ``x-api-key``) → 401
   ``UNAUTHORIZED``, and strips those headers (the key never reaches an upstream);
2. reads the body (the data plane reads it whole anyway) for its ``model``: a model the key may
   not use → 403 ``MODEL_NOT_ALLOWED``; a key without ``allow_external`` may not use a model an
   ``external`` upstream serves (403 ``EXTERNAL_UPSTREAM_FORBIDDEN``), nor ``/u/`` to one;
3. clamps ``X-Request-Class`` down to the key's ``max_class`` (never up, never refused);
4. reserves the request's estimate against the key's limits (429 with the limit's code);
5. for a stream whose client did not ask for usage, adds ``stream_options.include_usage`` and
   takes the extra usage out of what the client receives;
6. when the response ends, settles the reservation with the real usage and records it (per key,
   model, upstream); an error response or a replay gives the reservation back.

The fast path (:mod:`gpugate.web.fastpath`) serves the OpenAI routes without ASGI: it calls
:meth:`ClientKeys.serve` with its exchange, which does 1 and 3 on the headers and puts a
:class:`Keyed` on the exchange; the data plane, which parses the body anyway, has it do 2, 4 and
5 (:meth:`Keyed.admit`, through the same checks as ASGI's: :meth:`ClientKeys.allowed`) and tells
it what a whole answer said (its usage, upstream and model: the reading the GenAI histograms
take anyway), so 6 reads no answer again and the answer goes to the client unwatched (but for a
stream whose usage is hidden). Under ASGI (``/u/``, ``GPUGATE_FASTPATH=0``) :class:`_Watch`
watches the ASGI messages and reads the usage itself (:func:`~gpugate.core.usage.json_usage`,
:class:`~gpugate.core.usage.StreamUsage`).

The job routes and ``/v1/models`` check keys in :func:`authorize_client`, called by
:class:`gpugate.web.api.Endpoint` for every ``Security.CLIENT`` operation.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpugate.config import GatewayConfig
from gpugate.core.keys import ClientKey, Principal, offered_secret
from gpugate.core.usage import (
    StreamUsage,
    json_usage,
    with_include_usage,
)
from gpugate.errors import (
    BadRequest,
    ExternalUpstreamForbidden,
    GpugateError,
    KeyLimited,
    ModelNotAllowed,
    PayloadTooLarge,
    RunnerNotAllowed,
)
from gpugate.services.jobs import JobRequest
from gpugate.services.limits import Reservation
from gpugate.web.bodies import json_document, parsed_body
from gpugate.web.errors import error_body, error_headers, status_of
from gpugate.web.exchange import Exchange
from gpugate.web.requestid import HEADER as REQUEST_ID
from gpugate.web.requestid import RequestIds
from gpugate.wiring import Gateway

if TYPE_CHECKING:
    from gpugate.services.proxy import Reply
    from gpugate.telemetry import Generated
    from gpugate.web.fastpath import FastCycle

OPENAI_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})
RAW_PREFIX = "/u/"
_KEY_HEADERS = frozenset({b"authorization", b"api-key", b"x-api-key"})
_DROPPED = _KEY_HEADERS | {b"x-request-class"}  # what _Head reads and leaves out
_ANSWER_HEADERS = frozenset(
    {b"x-gateway-upstream", b"x-gateway-model", b"idempotent-replayed", b"content-type"}
)  # what _Watch.started reads
_MAX_KEPT = 8 * 1024 * 1024  # a JSON response longer than this is not parsed for its usage
log = logging.getLogger("gpugate.keys")


async def authorize_client(request: Request, gateway: Gateway) -> Principal | None:
    """The principal of a ``Security.CLIENT`` request (None with ``auth.mode: open``, or for
    the admin token: operators see every tenant's jobs), kept on ``request.state.principal``;
    :class:`Unauthorized` without a valid key."""
    keys = gateway.keys
    if keys is None or not keys.enforced:
        request.state.principal = None
        return None
    offered = offered_secret(request.headers.raw)
    admin = gateway.admin_token
    if (
        offered is not None
        and admin is not None
        and hmac.compare_digest(offered.encode(), admin.encode())
    ):
        request.state.principal = None  # an operator: every tenant's jobs, as in open mode
        return None
    principal = await keys.authenticate(offered)
    request.state.principal = principal
    return principal


def principal_of(request: Request) -> Principal | None:
    """Who sent a ``Security.CLIENT`` request (None with ``auth.mode: open``)."""
    found: Principal | None = getattr(request.state, "principal", None)
    return found


def tenant_of(request: Request) -> str | None:
    """The tenant a job-route request acts for (None: open mode, which sees everything)."""
    principal = principal_of(request)
    return None if principal is None else principal.tenant


def keyed_job(request: Request, gateway: Gateway, job: JobRequest) -> JobRequest:
    """A job request as its client key allows it (unchanged with ``auth.mode: open``): owned
    by the key's tenant, its class clamped down, external use only if the key allows it;
    403 for a model or a runner the key may not use (the default runtime counts when the
    request names none)."""
    principal = principal_of(request)
    if principal is None:
        return job
    key = principal.key
    if not key.may_use_model(job.model):
        raise ModelNotAllowed(f"client key {key.prefix}… may not use model {job.model!r}")
    runner = job.runner or gateway.config.default_runtime
    if not key.may_use_runner(runner):
        raise RunnerNotAllowed(f"client key {key.prefix}… may not use runner {runner!r}")
    return replace(
        job,
        cls=key.clamp(job.cls),
        allow_external=job.allow_external and key.allow_external,
        tenant=key.tenant,
    )


async def check_owned(
    request: Request, gateway: Gateway, kind: str, thing_id: str, missing: GpugateError
) -> None:
    """Raise ``missing`` (a 404) unless the request's tenant owns the thing (open mode and
    operators pass)."""
    tenant = tenant_of(request)
    if tenant is not None and await gateway.store.owner(kind, thing_id) != tenant:
        raise missing


async def record_owned(request: Request, gateway: Gateway, kind: str, *ids: str | None) -> None:
    """The request's tenant owns these things from now on (nothing in open mode)."""
    tenant = tenant_of(request)
    if tenant is None:
        return
    for thing_id in ids:
        if thing_id is not None:
            await gateway.store.own(kind, thing_id, tenant)


def di_allowed(principal: Principal) -> None:
    """A client key may use the Azure DI façade (an external service, DI model ids that are not
    the data plane's models) only with ``allow_external`` and no ``models`` list."""
    key = principal.key
    if not key.allow_external:
        raise ExternalUpstreamForbidden(
            f"client key {key.prefix}… may not use external upstreams (Azure DI is one)"
        )
    if key.models is not None:
        raise ModelNotAllowed(f"client key {key.prefix}… is limited to models, not Azure DI")


class _Plane(Protocol):
    """What :meth:`ClientKeys.serve` hands an admitted request to (the data plane's handler)."""

    async def serve(self, ex: Exchange, *, openai: bool) -> None: ...


class ClientKeys:
    """The middleware of the module docstring."""

    def __init__(self, app: ASGIApp, gateway: Gateway, ids: RequestIds) -> None:
        self.app = app
        self.gateway = gateway
        self.ids = ids
        self._external: tuple[GatewayConfig | None, frozenset[str]] = (None, frozenset())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        keys = self.gateway.keys
        if scope["type"] != "http" or keys is None or not keys.enforced:
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        openai = path in OPENAI_ROUTES and scope["method"] == "POST"
        if not openai and not path.startswith(RAW_PREFIX):
            await self.app(scope, receive, send)
            return
        try:
            if openai:
                head = _Head(scope["headers"])
                principal = await keys.authenticate(head.secret)
                entry = await self._openai(principal, head, scope, receive)
            else:
                principal = await keys.authenticate(offered_secret(scope["headers"]))
                entry = await self._raw(principal, scope, receive)
        except GpugateError as exc:
            await self._refuse(scope, send, exc)
            return
        scope, receive, watch = entry
        try:
            await self.app(scope, receive, watch.send(send))
        finally:
            await _settle(watch)

    async def serve(self, ex: FastCycle, plane: _Plane) -> None:
        """A keyed request to an OpenAI route, as :meth:`__call__` does it, over an
        :class:`~gpugate.web.exchange.Exchange` instead of ASGI (the fast path): the key
        authenticated and taken out of the headers, the class clamped, then the data plane
        (``plane``) serves the exchange with a :class:`Keyed` on it, which admits the body the
        data plane parses (the model, the usage option, the reservation) and is told what the
        answer said; the answer goes to the client unwatched unless the usage asked for it is
        to be hidden. What the request holds of its key's limits is settled at its end."""
        keys = self.gateway.keys
        assert keys is not None
        headers = ex.headers
        found = dict(headers)
        raw = found.get(b"authorization")
        principal = None
        if raw is not None and len(found) == len(headers) and _PLAIN.isdisjoint(found):
            principal = keys.known_header(raw)  # a key seen before: one dict lookup
            if principal is not None:  # and nothing to rewrite but the key taken out: in place
                headers.remove((b"authorization", raw))
                if principal.plain_class is not None:
                    headers.append(principal.plain_class)
        if principal is None:
            head = _Head(headers)
            try:
                secret = head.secret
                principal = keys.known(secret) or await (
                    keys.authenticate(secret)
                    if head.raw is None
                    else keys.authenticate_header(head.raw, secret)
                )
                ex.headers = head.admitted(principal, principal.class_header(head.requested))
            except GpugateError as exc:
                await ex.answer(*self._refusal(headers, exc))
                return
        keyed = ex.keyed = Keyed(self, principal)
        try:
            await plane.serve(ex, openai=True)
        finally:
            spare = keyed.end(ex)
            if spare:  # concurrency slots back to the store
                await self.gateway.quota.return_slots(principal.key.id, spare)

    def allowed(self, key: ClientKey, model: str, config: GatewayConfig) -> None:
        """Refuse a model the key may not use (403 ``MODEL_NOT_ALLOWED``), or one an external
        upstream serves when the key may not use those (403 ``EXTERNAL_UPSTREAM_FORBIDDEN``)."""
        if key.models is not None and model not in key.models:
            raise ModelNotAllowed(f"client key {key.prefix}… may not use model {model!r}")
        if not key.allow_external:
            external = self._external
            if external[0] is not config:  # the models found once per config version
                external = self._external = (config, served_externally(config))
            if model in external[1]:
                raise ExternalUpstreamForbidden(
                    f"client key {key.prefix}… may not use an external upstream, and one "
                    f"serves {model!r}"
                )

    async def _openai(
        self, principal: Principal, head: _Head, scope: Scope, receive: Receive
    ) -> tuple[Scope, Receive, _Watch]:
        body = await _read_body(receive, self.gateway.config.server.max_body_bytes)
        query = scope["query_string"]
        path = scope["path"] + "?" + query.decode("latin-1") if query else scope["path"]
        headers, body, watch = await self.admit(principal, head, body, path)
        return {**scope, "headers": headers}, _replay(body, receive), watch

    async def admit(
        self, principal: Principal, head: _Head, body: bytes, path: str
    ) -> tuple[list[tuple[bytes, bytes]], bytes, _Watch]:
        """An authenticated request to ``path`` (an OpenAI route, its query with it), let in
        or refused (a :class:`GpugateError`): the headers and body the data plane gets, and the
        watch its response goes through. A key over its limits is let in, unreserved, when the
        data plane will replay a kept answer (a replay comes before admission, DESIGN §3)."""
        gw = self.gateway
        headers, body, model, hide, doc = self._checked(principal, head, body, gw.config)
        held = None
        if principal.limited:
            try:
                held = await gw.quota.reserve(principal, model, doc, len(body))
            except KeyLimited:
                key = next((v for k, v in headers if k == b"idempotency-key"), None)
                if (
                    key is None
                    or await gw.idempotency.kept(key.decode("latin-1"), "POST", path, body) is None
                ):
                    raise
        return headers, body, _Watch(gw, principal, held, model, hide=hide)

    def _checked(
        self, principal: Principal, head: _Head, body: bytes, config: GatewayConfig
    ) -> tuple[list[tuple[bytes, bytes]], bytes, str | None, bool, dict[str, Any] | None]:
        """:meth:`admit` but for the reservation and the watch: the checks, the class clamp,
        the usage option, the header rewrite. The headers and body the data plane gets, the
        model, whether the answer's usage is to be hidden, and the parsed body (the
        reservation's estimate reads it)."""
        cls_header = principal.class_header(head.requested)  # a bad class: 400 before reserving
        doc = json_document(body)  # BadRequest as the data plane would answer
        model = doc.get("model") if type(doc) is dict else None
        if type(model) is not str:  # the data plane's 400 (or a body that is no object)
            return head.admitted(principal, cls_header, len(body)), body, None, False, None
        self.allowed(principal.key, model, config)
        asked = with_include_usage(doc, body) if doc.get("stream") is True else None
        hide = asked is not None
        # the data plane's parse of the bytes it gets: ``doc``, set as the bytes are
        body = parsed_body(body if asked is None else asked, doc)
        return head.admitted(principal, cls_header, len(body)), body, model, hide, doc

    async def _raw(
        self, principal: Principal, scope: Scope, receive: Receive
    ) -> tuple[Scope, Receive, _Watch]:
        gw = self.gateway
        key = principal.key
        upstream_id = scope["path"][len(RAW_PREFIX) :].partition("/")[0]
        upstream = next((u for u in gw.config.upstreams if u.id == upstream_id), None)
        if upstream is not None:
            if upstream.external and not key.allow_external:
                raise ExternalUpstreamForbidden(
                    f"client key {key.prefix}… may not use the external upstream {upstream_id!r}"
                )
            if key.models is not None and not set(upstream.models) <= set(key.models):
                raise ModelNotAllowed(
                    f"client key {key.prefix}… may not use every model of {upstream_id!r}"
                )
        headers = _client_headers(scope["headers"], principal)  # a bad class: 400 first
        length = _content_length(scope["headers"])
        held = await gw.quota.reserve(principal, None, None, length)
        return {**scope, "headers": headers}, receive, _Watch(gw, principal, held, None, hide=False)

    async def _refuse(self, scope: Scope, send: Send, exc: GpugateError) -> None:
        status, headers, body = self._refusal(scope["headers"], exc)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def _refusal(
        self, request_headers: list[tuple[bytes, bytes]], exc: GpugateError
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """The JSON error answer for a refused request: status, headers, body."""
        offered = next((v for k, v in request_headers if k == b"x-request-id"), None)
        rid = self.ids.choose(offered)
        headers = [(b"content-type", b"application/json"), (REQUEST_ID, rid)]
        headers += [(k.encode(), v.encode()) for k, v in error_headers(exc).items()]
        return status_of(exc), headers, error_body(exc)

    def __repr__(self) -> str:
        return f"<ClientKeys keys={self.gateway.keys!r}>"


class _Watch:
    """One keyed request's response as it goes out: its usage, and the end of its reservation."""

    __slots__ = (
        "complete",
        "gateway",
        "held",
        "hide",
        "kept",
        "kept_size",
        "model",
        "principal",
        "replayed",
        "status",
        "stream",
        "upstream",
    )

    def __init__(
        self,
        gateway: Gateway,
        principal: Principal,
        held: Reservation | None,
        model: str | None,
        *,
        hide: bool,
    ) -> None:
        self.gateway = gateway
        self.principal = principal
        self.held = held
        self.model = model
        self.status: int | None = None
        self.upstream: str | None = None
        self.replayed = False
        self.complete = False
        self.stream: StreamUsage | None = None
        self.hide = hide
        self.kept: list[bytes] | None = None
        self.kept_size = 0

    def send(self, send: Send) -> Send:
        """``send`` with the response going through :meth:`started` and :meth:`piece`."""

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.body":
                chunk: bytes = message.get("body", b"")
                out = self.piece(chunk, more=message.get("more_body", False))
                if out is not chunk:
                    message = {**message, "body": out}
            elif message["type"] == "http.response.start":
                self.started(message["status"], message.get("headers", []))
            await send(message)

        return watched

    def started(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """The response's status and headers: who answered, and how its usage will come."""
        self.status = status
        content_type = b""
        for name, value in headers:
            if name not in _ANSWER_HEADERS:  # most of them: one set lookup each
                continue
            if name == b"x-gateway-upstream":
                self.upstream = value.decode("latin-1")
            elif name == b"x-gateway-model" and self.model is not None:
                self.model = value.decode("latin-1")  # the model that answered (a fallback)
            elif name == b"idempotent-replayed":
                self.replayed = True
            elif name == b"content-type":
                content_type = value
        if self.status == 200 and not self.replayed:
            if content_type.startswith(b"text/event-stream"):
                self.stream = StreamUsage(hide=self.hide)
            else:
                self.kept = []

    def piece(self, chunk: bytes, *, more: bool) -> bytes:
        """A piece of the response body, as the client gets it (``chunk`` itself unless the
        gateway's own usage chunk is taken out); its usage counted."""
        stream = self.stream
        if stream is not None:  # an SSE event (or a few) at a time: kept lean
            if more and stream.passes(chunk):
                return chunk
            out = stream.feed(chunk)
            if not more:
                self.complete = True
                out += stream.flush()
            return out
        if not more:
            self.complete = True
        if self.kept is not None:
            self.kept_size += len(chunk)
            if self.kept_size > _MAX_KEPT:
                self.kept = None
            else:
                self.kept.append(chunk)
        return chunk

    def _tokens(self) -> tuple[int, int]:
        """The answer's prompt and completion tokens: its usage, else the estimate's."""
        kept = self.kept
        if self.stream is not None:
            usage = self.stream.usage
        elif kept is not None:
            usage = json_usage(kept[0] if len(kept) == 1 else b"".join(kept))
        else:
            usage = None
        if usage is not None:
            return usage.prompt_tokens, usage.completion_tokens
        if self.held is not None:
            return self.held.prompt_tokens, self.held.completion_tokens
        return 0, 0

    @property
    def _answered(self) -> bool:
        """Whether the upstream answered it (a success, not a replay): its usage counts."""
        return self.status is not None and self.status < 400 and not self.replayed

    def end(self) -> int:
        """The request ended: its reservation settled or given back, its usage recorded; the
        concurrency slots to give back to the store (:meth:`Quota.settle_local`)."""
        gw = self.gateway
        if not self._answered:
            return gw.quota.release_local(self.held)
        prompt, completion = self._tokens()
        spare = gw.quota.settle_local(self.held, prompt, completion)
        gw.usage.record(self.principal, self.model or "", self.upstream or "", prompt, completion)
        return spare


async def _settle(watch: _Watch) -> None:
    """The end of a keyed request, however it ended: its reservation settled or given back."""
    spare = watch.end()
    if spare:  # concurrency slots back to the store
        await watch.gateway.quota.return_slots(watch.principal.key.id, spare)


class Keyed:
    """A keyed request on the fast path, on its exchange (``Exchange.keyed``) while the data
    plane serves it: :meth:`admit` checks the parsed body against the key and holds its
    estimate, :meth:`generated` is told what a whole answer said (its usage, upstream and model,
    read once for the GenAI histograms and the key alike), and :meth:`end` settles what
    it holds and records its usage. ``stream`` hides the usage of a
    stream the gateway asked for (``FastCycle.body`` passes the pieces through it)."""

    __slots__ = ("counted", "door", "held", "model", "principal", "stream", "waiting")

    def __init__(self, door: ClientKeys, principal: Principal) -> None:
        self.door = door
        self.principal = principal
        self.held: Reservation | None = None
        self.model: str | None = None
        self.stream: StreamUsage | None = None
        #: what a whole answer counts, as :meth:`generated` read it: model, upstream, prompt
        #: and completion tokens; False for an error answer; None when the data plane told
        #: nothing (a relay that broke off: :meth:`_untold`)
        self.counted: tuple[str, str, int, int] | bool | None = None
        self.waiting = False

    def admit(self, doc: dict[str, Any], body: bytes, model: str, *, stream: bool) -> bytes:
        """The body the upstream gets, once the key may use ``model``: with
        ``stream_options.include_usage`` set for a stream whose client did not ask (the
        usage is then hidden from it); the estimate held from this replica's slice when it
        holds enough (else ``waiting``: :meth:`reserve` asks the store)."""
        principal = self.principal
        door = self.door
        gw = door.gateway
        door.allowed(principal.key, model, gw.config)
        self.model = model
        if stream:
            asked = with_include_usage(doc, body)
            if asked is not None:
                self.stream = StreamUsage(hide=True)
                body = asked
        if principal.limited:
            self.held = gw.quota.reserve_now(principal, model, doc, len(body))
            self.waiting = self.held is None
        return body

    async def reserve(self, doc: dict[str, Any], size: int) -> None:
        """The estimate held by the store (429 with the limit's code when it cannot be)."""
        self.held = await self.door.gateway.quota.reserve(self.principal, self.model, doc, size)
        self.waiting = False

    def usage_read(self) -> tuple[int | None, int | None] | None:
        stream = self.stream
        if stream is None:
            return None
        usage = stream.usage  # its hiding read every piece: the usage it found, or none
        return (None, None) if usage is None else (usage.prompt_tokens, usage.completion_tokens)

    def generated(self, reply: Reply, told: Generated) -> None:
        """A whole answer went by (the data plane's tale, read once for the GenAI histograms
        and the key alike): what it counts, kept for the end (an error counts nothing)."""
        if reply.status >= 400:
            self.counted = False
            return
        model = self.model
        if reply.model is not None and model is not None:
            model = reply.model  # the model that answered (a fallback)
        upstream = reply.upstream.id
        if told.input_tokens is not None:
            self.counted = (model or "", upstream, told.input_tokens, told.output_tokens or 0)
        else:
            self.counted = self._read(model, upstream)

    def _untold(self, ex: FastCycle) -> tuple[str, str, int, int] | bool:
        """What a request counts that the data plane told nothing of: a relay that broke off
        counts (its usage, else its estimate), an error or a replay does not."""
        status, answered = ex.status, ex.answered
        if type(status) is not int or status >= 400 or _REPLAYED in answered:
            return False
        return self._read(self.model, _upstream_of(answered))

    def _read(self, model: str | None, upstream: str) -> tuple[str, str, int, int]:
        """The tokens of an answer that did not tell them: a hidden stream's usage, else the
        estimate's (an answer that came without usage)."""
        usage = self.stream.usage if self.stream is not None else None
        if usage is not None:
            return model or "", upstream, usage.prompt_tokens, usage.completion_tokens
        held = self.held
        if held is None:
            return model or "", upstream, 0, 0
        return model or "", upstream, held.prompt_tokens, held.completion_tokens

    def end(self, ex: FastCycle) -> int:
        """The end of the request: its reservation settled or given back, its usage recorded;
        no await. The concurrency slots to give back to the store (:meth:`Quota.settle_local`:
        0 but for a key with a concurrency limit under 20, whose slot goes back at once)."""
        gw = self.door.gateway
        counted = self.counted
        if counted is None:
            counted = self._untold(ex)
        if counted is False:
            return gw.quota.release_local(self.held)
        model, upstream, prompt, completion = counted  # type: ignore[misc]
        held = self.held
        spare = 0 if held is None else gw.quota.settle_local(held, prompt, completion)
        gw.usage.record(self.principal, model, upstream, prompt, completion)
        return spare


_REPLAYED = (b"idempotent-replayed", b"true")


def _upstream_of(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name == b"x-gateway-upstream":
            return value.decode("latin-1")
    return ""


def served_externally(config: GatewayConfig) -> frozenset[str]:
    """What ``any(u.external for u in config.upstreams_serving(model))`` says, for every model."""
    return frozenset(
        model for u in config.upstreams if u.kind == "openai" and u.external for model in u.models
    )


#: What a head must not have for :meth:`ClientKeys.serve` to take only its key out, in place
_PLAIN = frozenset({b"api-key", b"x-api-key", b"x-request-class", b"idempotency-key"})


class _Head:
    """A keyed OpenAI-route request's headers, read in one pass: the secret it offers (as
    :func:`~gpugate.core.keys.offered_secret` finds it), the ``Authorization`` value it came
    in (``raw``: the key cache remembers it, so that the next request of the key is one dict
    lookup), the class it asks for, and the rest (:meth:`admitted` makes the data plane's
    headers of them)."""

    __slots__ = ("kept", "raw", "requested", "secret")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        kept: list[tuple[bytes, bytes]] = []
        raw = bearer = api_key = x_api_key = requested = None
        for item in headers:
            name = item[0]
            if name in _DROPPED:
                value = item[1]
                if name == b"authorization":
                    found = _bearer(value)
                    if found is not None:
                        raw, bearer = value, found
                elif name == b"x-request-class":
                    requested = value
                elif name == b"api-key":
                    api_key = value.strip() or None
                elif name == b"x-api-key":
                    x_api_key = value.strip() or None
                continue
            kept.append(item)
        chosen = bearer or api_key or x_api_key
        self.secret = None if chosen is None else chosen.decode("latin-1")
        self.raw = raw if bearer is not None else None
        self.requested = requested
        self.kept = kept

    def admitted(
        self,
        principal: Principal,
        cls_header: tuple[bytes, bytes] | None,
        length: int | None = None,
    ) -> list[tuple[bytes, bytes]]:
        """The headers the data plane gets: without the key, an ``Idempotency-Key`` in the key's
        tenant (one tenant's key never names another's response), the class clamped
        (``cls_header``: :meth:`Principal.class_header`; none for the default class), and
        ``length`` as the body's (None: the client's ``Content-Length`` is kept — the fast path
        reads the body itself, and the upstream's length is always the body's own)."""
        kept = self.kept
        for at, (name, value) in enumerate(kept):
            if name == b"idempotency-key":
                kept[at] = (name, principal.idempotency_prefix + value)
        if length is not None:
            kept = [item for item in kept if item[0] != b"content-length"]
            kept.append((b"content-length", b"%d" % length))
        if cls_header is not None:
            kept.append(cls_header)
        return kept


def _bearer(value: bytes) -> bytes | None:
    """The credentials of an ``Authorization: Bearer`` value, or None."""
    scheme, _, rest = value.partition(b" ")
    if scheme.lower() == b"bearer" and rest.strip():
        return rest.strip()
    return None


def _client_headers(
    headers: list[tuple[bytes, bytes]], principal: Principal
) -> list[tuple[bytes, bytes]]:
    """A ``/u/`` request's headers without its key, its class clamped (its length kept)."""
    kept = []
    requested: bytes | None = None
    for name, value in headers:
        if name in _KEY_HEADERS:
            continue
        if name == b"x-request-class":
            requested = value
        elif name == b"idempotency-key":  # one tenant's key never names another's response
            kept.append((name, principal.idempotency_prefix + value))
        else:
            kept.append((name, value))
    cls_header = principal.class_header(requested)
    if cls_header is not None:
        kept.append(cls_header)
    return kept


def _content_length(headers: list[tuple[bytes, bytes]]) -> int:
    for name, value in headers:
        if name == b"content-length" and value.isdigit():
            return int(value)
    return 0


async def _read_body(receive: Receive, limit: int) -> bytes:
    parts = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BadRequest("the client went away before sending its body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds max_body_bytes ({limit})")
        parts.append(chunk)
        more = message.get("more_body", False)
    return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the already-read body over once, then the client's own."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
