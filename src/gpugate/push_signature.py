"""Signed push-protocol messages: HMAC-SHA256 in both directions, with replay protection.

Shared by the gateway and the push worker (a separate program: this module is foundation and
imports nothing of gpugate). The runtime's secret itself never travels; each side derives one
key per direction from it, so a message one side signed can never pass as the other side's::

    key(direction) = HMAC-SHA256(secret, "gpugate push v1 " + direction)
    direction      = "gateway-to-worker" | "worker-to-gateway"

A **request** carries ``X-Gpugate-Signature: t=<unix seconds>,n=<nonce>[,k=<runtime id>],v1=<hex>``
(``k`` only tells a receiver with many keys which one to try first) over::

    gpugate-push-v1 \\n <direction> \\n request \\n <t> \\n <nonce> \\n <METHOD> \\n <path?query>
    \\n <X-Lease-Token or empty> \\n <hex SHA-256 of the body>

The receiver accepts it when the MAC is right, ``t`` is within ``WINDOW_S`` of its clock and the
nonce is new (:class:`NonceCache`: bounded in memory; a nonce evicted for room raises a floor
below which timestamps are refused, so eviction never reopens a replay).

An **answer** carries ``X-Gpugate-Signature: n=<the request's nonce>,v1=<hex>`` over::

    gpugate-push-v1 \\n <direction> \\n response \\n <request nonce> \\n <status> \\n <hex SHA-256>

bound to the request it answers, so an old answer cannot be replayed to a new request (this is
what authenticates the reaper's ``GET /calls/{id}``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

HEADER = "X-Gpugate-Signature"
GATEWAY_TO_WORKER = "gateway-to-worker"
WORKER_TO_GATEWAY = "worker-to-gateway"
WINDOW_S = 300.0  # how far a request's timestamp may be from the receiver's clock
_VERSION = "gpugate-push-v1"
_MAX_NONCE = 64


class BadSignature(ValueError):
    """A message without a valid signature (the reason is in the message, never a key)."""


@dataclass(frozen=True, slots=True)
class Signed:
    """A request whose signature verified: when it was signed, and its nonce."""

    timestamp: int
    nonce: str


def derive_key(secret: str, direction: str) -> bytes:
    """The key of one direction, derived from the runtime's secret."""
    label = f"gpugate push v1 {direction}".encode()
    return hmac.new(secret.encode(), label, hashlib.sha256).digest()


def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "\n".join((_VERSION, *parts)).encode(), hashlib.sha256).hexdigest()


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def sign_request(  # noqa: PLR0913 - every part of the request is signed
    key: bytes,
    direction: str,
    *,
    method: str,
    target: str,
    body: bytes,
    lease_token: str | None,
    now: float,
    nonce: str | None = None,
    key_id: str | None = None,
) -> str:
    """The signature header's value for a request to ``target`` (its path and query);
    ``key_id`` (``k=``, the runtime's id) tells a receiver that holds many keys which to try."""
    timestamp, nonce = int(now), nonce or secrets.token_urlsafe(16)
    parts = ("request", str(timestamp), nonce, method.upper(), target, lease_token or "")
    mac = _mac(key, direction, *parts, _digest(body))
    hint = f"k={key_id}," if key_id and "," not in key_id and "=" not in key_id else ""
    return f"t={timestamp},n={nonce},{hint}v1={mac}"


def key_hint(header: str | None) -> str | None:
    """The ``k=`` of a request signature (which key signed it, as the sender says), if any."""
    try:
        return _fields(header).get("k") or None
    except BadSignature:
        return None


def credentials(  # noqa: PLR0913 - every part of the request is signed
    secret: str,
    direction: str,
    auth: str,
    *,
    method: str,
    target: str,
    body: bytes,
    lease_token: str | None,
    key_id: str | None = None,
) -> tuple[dict[str, str], str | None]:
    """The headers that authenticate a request the sender makes now, and its nonce (to check
    the answer with): ``auth="signed"`` signs it with ``direction``'s key, ``"bearer"`` (the
    wave-1 compatibility mode) sends the secret itself and has no nonce."""
    if auth == "bearer":
        return {"Authorization": f"Bearer {secret}"}, None
    signature = sign_request(
        derive_key(secret, direction),
        direction,
        method=method,
        target=target,
        body=body,
        lease_token=lease_token,
        now=time.time(),
        key_id=key_id,
    )
    return {HEADER: signature}, request_nonce(signature)


def _fields(header: str | None) -> dict[str, str]:
    if not header:
        raise BadSignature(f"no {HEADER} header")
    fields = {}
    for item in header.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep:
            raise BadSignature(f"malformed {HEADER} header")
        fields[name] = value
    return fields


def verify_request(  # noqa: PLR0913 - every part of the request is checked
    keys: Iterable[tuple[str, bytes]],
    direction: str,
    header: str | None,
    *,
    method: str,
    target: str,
    body: bytes,
    lease_token: str | None,
    now: float,
    window_s: float = WINDOW_S,
) -> tuple[frozenset[str], Signed]:
    """Which of ``keys`` (id, key) signed this request, and its timestamp and nonce;
    :class:`BadSignature` when none did or the timestamp is outside the window. Every key is
    tried, so the time taken does not tell which one came close."""
    fields = _fields(header)
    stamp, nonce, offered = fields.get("t", ""), fields.get("n", ""), fields.get("v1", "")
    if not (stamp.isdigit() and nonce and len(nonce) <= _MAX_NONCE and offered):
        raise BadSignature(f"malformed {HEADER} header")
    timestamp = int(stamp)
    if abs(now - timestamp) > window_s:
        raise BadSignature(
            f"signed {now - timestamp:+.0f} s from this clock (the window is {window_s:g} s): "
            "check both clocks"
        )
    parts = ("request", stamp, nonce, method.upper(), target, lease_token or "", _digest(body))
    matched = frozenset(
        key_id
        for key_id, key in keys
        if hmac.compare_digest(_mac(key, direction, *parts).encode(), offered.encode())
    )
    if not matched:
        raise BadSignature("the signature is not that of any runtime key")
    return matched, Signed(timestamp, nonce)


def sign_response(
    key: bytes, direction: str, *, request_nonce: str, status: int, body: bytes
) -> str:
    """The signature header's value for the answer to the request with ``request_nonce``."""
    mac = _mac(key, direction, "response", request_nonce, str(status), _digest(body))
    return f"n={request_nonce},v1={mac}"


def response_valid(
    key: bytes,
    direction: str,
    header: str | None,
    *,
    request_nonce: str,
    status: int,
    body: bytes,
) -> bool:
    """Whether ``header`` signs this answer to the request with ``request_nonce``."""
    try:
        fields = _fields(header)
    except BadSignature:
        return False
    if fields.get("n") != request_nonce:
        return False
    expected = _mac(key, direction, "response", request_nonce, str(status), _digest(body))
    return hmac.compare_digest(expected.encode(), fields.get("v1", "").encode())


def request_nonce(header: str) -> str:
    """The nonce of a request signature this side just made."""
    return _fields(header)["n"]


class NonceCache:
    """The nonces of the requests accepted within the window, at most ``max_entries``."""

    def __init__(self, *, window_s: float = WINDOW_S, max_entries: int = 65_536) -> None:
        self.window_s = window_s
        self.max_entries = max_entries
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._floor = -1  # timestamps at or below it are refused (their nonces may be gone)
        self.replays = 0

    def admit(self, signed: Signed, now: float) -> bool:
        """True the first time a nonce is offered; False for a replay (or a request older than
        what the cache can still vouch for)."""
        while self._seen and next(iter(self._seen.values())) < now - self.window_s:
            self._seen.popitem(last=False)
        if signed.timestamp <= self._floor or signed.nonce in self._seen:
            self.replays += 1
            return False
        self._seen[signed.nonce] = signed.timestamp
        while len(self._seen) > self.max_entries:
            _, evicted = self._seen.popitem(last=False)
            self._floor = max(self._floor, evicted)
        return True

    def __len__(self) -> int:
        return len(self._seen)

    def __repr__(self) -> str:
        return f"<NonceCache nonces={len(self._seen)} replays={self.replays}>"
