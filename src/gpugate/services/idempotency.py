"""Idempotency-Key for the sync path, as the IETF draft describes it.

The first completed non-streaming response (status, headers, body) under a key is kept in the store
for ``idempotency_ttl_s``; a replay gets it back byte-identical, before admission, with
``Idempotent-Replayed: true`` — and it survives a restart because it lives in the store.

A duplicate that arrives while the first request is still in flight gets 409
``IDEMPOTENCY_CONFLICT`` at once (it does not wait: a client that retries after a timeout should
not hold a second connection open for the length of a generation). The same key with a different
request body gets 422 ``IDEMPOTENCY_KEY_REUSED``. Responses with a 5xx status or one that asks
for a retry (408, 425, 429: :func:`gpugate.retry.retryable`), streams and requests that failed in
the gateway are not kept: the key is released so the client may retry.
Nor is a response larger than ``server.max_idempotent_response_bytes`` (default 1 MiB, issue #15
finding 4): the store does not grow by what an upstream returns, and a retry is sent again.

A key in flight is held only as long as its request can last (:func:`in_flight_bound_s`: every
try of the longest fallback chain and of the continuations, from the config's own deadlines),
not for the whole ``idempotency_ttl_s``: a key whose gateway died mid-request (killed, out of
memory, a lost replica) is free again once its request could no longer be running, so the
client's retry is served instead of a ``409`` for a day. The completed response is kept for
``idempotency_ttl_s`` from its completion.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from gpugate.config import GatewayConfig
from gpugate.errors import BadRequest, IdempotencyConflict, IdempotencyKeyReused
from gpugate.retry import retryable
from gpugate.services.continuation import MAX_CONTINUATIONS
from gpugate.store import InFlight, Mismatch, Replay, Store, request_fingerprint

MAX_KEY_LENGTH = 255
_CONTROL = frozenset(chr(c) for c in (*range(0x20), 0x7F))  # as every key a client sends (api.md)


def _printable(key: str) -> bool:
    return not any(char in _CONTROL for char in key)


@dataclass(frozen=True, slots=True)
class Ticket:
    """The right to complete (or abandon) one key: held by the request that started it."""

    key: str
    owner: str


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A response kept under a key, to be replayed byte for byte."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


def in_flight_bound_s(config: GatewayConfig) -> float:
    """The longest a request under a key can be in flight, from the config's deadlines: on the
    slowest upstream, each try waits for admission (``queue_timeout_s``), lasts at most
    ``timeout_s`` and is followed by the longest wait before the next
    (``retry_after_max_s`` or ``max_backoff_s``), ``retry.attempts`` times; for every model of
    the longest chain (``fallbacks`` and ``context_fallbacks``), and again on every upstream
    for each model of the chain in each of a broken stream's continuations."""
    per_model = max(
        (
            u.retry.attempts
            * (
                u.queue_timeout_s
                + u.timeout_s
                + max(u.retry.retry_after_max_s, u.retry.max_backoff_s)
            )
            for u in config.upstreams
        ),
        default=0.0,
    )
    models = 1 + max(
        (len(m.fallbacks) + len(m.context_fallbacks) for m in config.models), default=0
    )
    return per_model * models * (1 + MAX_CONTINUATIONS * len(config.upstreams))


class Idempotency:
    """Begin, complete or abandon a keyed request against the store."""

    def __init__(
        self,
        store: Store,
        ttl_s: float,
        *,
        max_body_bytes: int = 1 << 20,
        config: Callable[[], GatewayConfig] | None = None,
    ) -> None:
        self._store = store
        self._ttl_s = ttl_s
        #: A response body larger than this is not kept (the key is released instead).
        self.max_body_bytes = max_body_bytes
        self._config = config  # the live config, for how long a key may be in flight
        self._bound: tuple[GatewayConfig | None, float] = (None, ttl_s)

    def in_flight_s(self) -> float:
        """How long a key is held in flight: :func:`in_flight_bound_s` of the live config
        (worked out once per config version), at most ``idempotency_ttl_s``."""
        if self._config is None:
            return self._ttl_s
        config = self._config()
        made_for, bound = self._bound
        if made_for is not config:
            bound = min(self._ttl_s, in_flight_bound_s(config))
            self._bound = (config, bound)
        return bound

    async def begin(
        self, key: str, method: str, path: str, body: bytes, *, tenant_scoped: bool = False
    ) -> Ticket | StoredResponse:
        """A ticket to go ahead, or the stored response to replay; raises on conflict/reuse.

        ``tenant_scoped``: ``key`` is ``<tenant>:<the client's key>`` (``auth.mode: keys``, the
        door put the tenant in front); the client's own part is what the limits apply to."""
        own = key.partition(":")[2] if tenant_scoped else key
        if not own or len(own) > MAX_KEY_LENGTH or not _printable(own):
            raise BadRequest(
                f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters, no control characters"
            )
        owner = uuid.uuid4().hex
        outcome = await self._store.idem_begin(
            key, request_fingerprint(method, path, body), ttl_s=self.in_flight_s(), owner=owner
        )
        if isinstance(outcome, Replay):
            return _stored(outcome)
        if isinstance(outcome, InFlight):
            raise IdempotencyConflict(
                f"a request with Idempotency-Key {key!r} is still in flight", retry_after_s=1
            )
        if isinstance(outcome, Mismatch):
            raise IdempotencyKeyReused(
                f"Idempotency-Key {key!r} was used with a different request body"
            )
        return Ticket(key, owner)

    async def kept(self, key: str, method: str, path: str, body: bytes) -> StoredResponse | None:
        """The response :meth:`begin` would replay for this request, if one is kept; claims
        nothing (a client key over its limits still gets its kept answer: a replay comes before
        admission, DESIGN §3)."""
        found = await self._store.idem_replay(key, request_fingerprint(method, path, body))
        return None if found is None else _stored(found)

    async def complete(
        self, ticket: Ticket, status: int, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> None:
        """Keep the response for replays (5xx responses, those that ask for a retry — 408,
        425, 429 — and bodies over ``max_body_bytes``, release the key instead)."""
        if status >= 500 or retryable(status) or len(body) > self.max_body_bytes:
            await self.abandon(ticket)
            return
        pairs = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers]
        await self._store.idem_complete(
            ticket.key, ticket.owner, status, pairs, body, ttl_s=self._ttl_s
        )

    async def abandon(self, ticket: Ticket) -> None:
        """Release the key so the client may retry it."""
        await self._store.idem_abandon(ticket.key, ticket.owner)

    def __repr__(self) -> str:
        return f"<Idempotency ttl={self._ttl_s:g}s>"


def _stored(replay: Replay) -> StoredResponse:
    record = replay.record
    headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in record.headers]
    return StoredResponse(record.status, headers, record.body)
