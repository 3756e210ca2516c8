"""Client keys: what a key is, how its secret is made and recognised, and what it allows.

A key's secret is ``gk-`` followed by 43 URL-safe characters (32 random bytes). The store keeps
only its SHA-256 digest and a short public prefix (the first 11 characters: ``gk-`` and 8 more)
for display and logs. A fast hash is enough here, unlike for passwords: the secret has 256 bits
of entropy, so there is no dictionary to try and a brute force of the digest is hopeless; a slow
hash would only slow every request down.

The rules are pure: :meth:`ClientKey.refusal` says why a key cannot be used now (revoked,
expired), :meth:`ClientKey.may_use_model` whether it may name a model, and :func:`clamp` lowers a
requested class to the key's highest (never raises it).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpugate.core.classes import RequestClass, parse_request_class

SECRET_PREFIX = "gk-"  # noqa: S105 - how a secret starts, not a secret
PREFIX_LENGTH = 11
TENANT_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")  # no ':': a tenant prefixes its idempotency keys
LIMIT_NAMES = ("requests_per_min", "tokens_per_min", "concurrency", "daily_tokens", "daily_cents")
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})")


def parse_rfc3339(value: object) -> datetime:
    """``value`` as a moment, when it is an RFC 3339 time with its offset (what a key's
    ``expires_at`` is); :class:`ValueError` for anything else (a number, a date, no offset)."""
    if not isinstance(value, str) or _RFC3339.fullmatch(value) is None:
        raise ValueError("expected an RFC 3339 time with its offset: 2026-01-01T00:00:00+00:00")
    return datetime.fromisoformat(value.upper().replace(" ", "T"))


def new_secret() -> str:
    """A fresh key secret: ``gk-`` and 32 random bytes, URL-safe."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    """A key's public id (``key_`` and 16 hex digits): what the admin API names it by."""
    return "key_" + secrets.token_hex(8)


def digest(secret: str) -> str:
    """The stored form of a secret: its SHA-256, hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


def prefix_of(secret: str) -> str:
    """The short public part of a secret, safe to show and log."""
    return secret[:PREFIX_LENGTH]


@dataclass(frozen=True, slots=True)
class Limits:
    """A key's limits; ``None`` means unlimited."""

    requests_per_min: int | None = None
    tokens_per_min: int | None = None
    concurrency: int | None = None
    daily_tokens: int | None = None
    daily_cents: float | None = None

    @property
    def any(self) -> bool:
        """Whether any limit is set (a key without one never touches the quota tables)."""
        return any(getattr(self, name) is not None for name in LIMIT_NAMES)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in LIMIT_NAMES}

    @classmethod
    def of(cls, data: dict[str, Any] | None) -> Limits:
        data = data or {}
        return cls(**{name: data.get(name) for name in LIMIT_NAMES})


@dataclass(frozen=True, slots=True)
class ClientKey:
    """A stored key, without its secret."""

    id: str
    name: str
    tenant: str
    prefix: str
    models: tuple[str, ...] | None = None  # None: every model
    max_class: RequestClass = RequestClass.INTERACTIVE
    runners: tuple[str, ...] | None = None  # None: every runtime
    allow_external: bool = False
    limits: Limits = field(default_factory=Limits)
    expires_at: datetime | None = None
    created_at: datetime | None = None
    revoked_at: datetime | None = None

    def refusal(self, now: datetime) -> str | None:
        """Why this key cannot be used at ``now`` (revoked, expired), or None."""
        if self.revoked_at is not None and self.revoked_at <= now:
            return "the key is revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "the key has expired"
        return None

    def may_use_model(self, model: str) -> bool:
        return self.models is None or model in self.models

    def may_use_runner(self, runner: str) -> bool:
        return self.runners is None or runner in self.runners

    def clamp(self, requested: RequestClass) -> RequestClass:
        """``requested``, lowered to this key's highest class."""
        return clamp(requested, self.max_class)


def clamp(requested: RequestClass, highest: RequestClass) -> RequestClass:
    """A class no higher than ``highest``: a higher one is clamped down, never refused."""
    return requested if requested.priority <= highest.priority else highest


CLASS_HEADER = b"x-request-class"
DEFAULT_CLASS = RequestClass.INTERACTIVE  # the data plane's class for a request without one


def _class_header(cls: RequestClass) -> tuple[bytes, bytes] | None:
    return None if cls is DEFAULT_CLASS else (CLASS_HEADER, cls.value.encode())


@dataclass(frozen=True, slots=True)
class Principal:
    """Who sent a request: a client key (``auth.mode: keys``), with what every request of the
    key needs worked out once (a principal lives as long as its cache entry and serves each
    request of the key meanwhile): whether it has limits, the ``X-Request-Class`` header each
    requested class becomes, the prefix of its tenant's idempotency keys."""

    key: ClientKey
    limited: bool = field(init=False, compare=False, repr=False)  # any limit: the quota's
    dated: bool = field(init=False, compare=False, repr=False)  # a revocation or an expiry
    idempotency_prefix: bytes = field(init=False, compare=False, repr=False)
    #: the ``X-Request-Class`` header of a request that sends none (None: the default class)
    plain_class: tuple[bytes, bytes] | None = field(init=False, compare=False, repr=False)
    _classes: dict[bytes | None, tuple[bytes, bytes] | None] = field(
        init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        key = self.key
        classes: dict[bytes | None, tuple[bytes, bytes] | None] = {}
        for cls in RequestClass:
            classes[cls.value.encode()] = _class_header(key.clamp(cls))
        classes[None] = classes[b""] = _class_header(key.clamp(DEFAULT_CLASS))
        object.__setattr__(self, "limited", key.limits.any)
        object.__setattr__(self, "dated", key.revoked_at is not None or key.expires_at is not None)
        object.__setattr__(self, "idempotency_prefix", key.tenant.encode() + b":")
        object.__setattr__(self, "plain_class", classes[None])
        object.__setattr__(self, "_classes", classes)

    @property
    def tenant(self) -> str:
        return self.key.tenant

    def class_header(self, requested: bytes | None) -> tuple[bytes, bytes] | None:
        """The ``X-Request-Class`` header a request of this key goes on with: the class it asked
        for (``requested``, the raw header value; None when absent) clamped to the key's highest,
        or None for :data:`DEFAULT_CLASS` (what a request without the header is);
        :class:`~gpugate.errors.BadRequest` for a value that names no class."""
        try:
            return self._classes[requested]
        except KeyError:  # another spelling (case, spaces), or no class at all
            text = None if requested is None else requested.decode("latin-1")
            return _class_header(self.key.clamp(parse_request_class(text, default=DEFAULT_CLASS)))

    def __repr__(self) -> str:
        return f"<Principal key={self.key.prefix}… tenant={self.key.tenant}>"


def offered_secret(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The key a request offers: ``Authorization: Bearer <key>``, else ``api-key``, else
    ``x-api-key`` (the headers the ``openai`` and Azure clients send)."""
    bearer = api_key = x_api_key = None
    for name, value in headers:
        if name == b"authorization":
            scheme, _, rest = value.partition(b" ")
            if scheme.lower() == b"bearer" and rest.strip():
                bearer = rest.strip()
        elif name == b"api-key":
            api_key = value.strip() or None
        elif name == b"x-api-key":
            x_api_key = value.strip() or None
    chosen = bearer or api_key or x_api_key
    return None if chosen is None else chosen.decode("latin-1")
