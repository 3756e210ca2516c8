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

from gpugate.core.classes import RequestClass

SECRET_PREFIX = "gk-"  # noqa: S105 - how a secret starts, not a secret
PREFIX_LENGTH = 11
TENANT_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")  # no ':': a tenant prefixes its idempotency keys
LIMIT_NAMES = ("requests_per_min", "tokens_per_min", "concurrency", "daily_tokens", "daily_cents")


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


@dataclass(frozen=True, slots=True)
class Principal:
    """Who sent a request: a client key (``auth.mode: keys``)."""

    key: ClientKey

    @property
    def tenant(self) -> str:
        return self.key.tenant

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
