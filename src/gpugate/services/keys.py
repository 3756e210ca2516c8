"""Client keys as a service: create, update, rotate, revoke (audited), and authenticate requests.

Authentication looks the offered secret up in a small local cache before the store (one dict
lookup on a hit: the digest is computed, and the store asked, only on a miss); an entry is
trusted for ``auth.key_cache_s`` (default 2 s), so a key revoked or changed on one replica stops
working on every other replica within that delay plus one lookup. Unknown secrets are cached
too (so a flood of wrong keys costs one lookup per secret per TTL), in a cache of their own so
that such a flood never pushes a real key out; each cache is bounded
(``auth.max_keys_cached``; the oldest entries go first; a secret longer than
:data:`MAX_CACHED_SECRET` is kept as its digest, so the bound holds for memory too). A hit hands
back the entry's :class:`~gpugate.core.keys.Principal`, built once per lookup with what each
request of the key needs worked out. A miss is one lookup however many requests miss at once:
when an entry's delay is over, every request of the key in flight misses it together (64 store
queries in a row under ``wrk -c64``, every two seconds), so the requests that come while a lookup
of their secret runs wait for that one (a request that leaves does not cancel it for the others).

Bootstrap keys come from the environment variable named by ``auth.bootstrap_keys_env``: a JSON
list of ``{"name", "tenant", "key", ...}`` objects, with the fields of ``POST /admin/keys``
(``key`` is the secret, which must start with ``gk-``). Each is stored at start-up under the id
``boot-<name>`` (its hash only); a secret changed in the environment replaces the old one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from gpugate.clock import Clock
from gpugate.config import GatewayConfig
from gpugate.core.classes import RequestClass
from gpugate.core.keys import (
    LIMIT_NAMES,
    PREFIX_LENGTH,
    SECRET_PREFIX,
    TENANT_NAME,
    ClientKey,
    Limits,
    Principal,
    digest,
    new_key_id,
    new_secret,
    parse_rfc3339,
    prefix_of,
)
from gpugate.errors import ConfigError, ConfigProblem, KeyNotFound, KeyRevoked, Unauthorized
from gpugate.store import Store
from gpugate.store.keys import KEY_REVOKED, KEY_ROTATED, KEY_UPDATED

log = logging.getLogger("gpugate.keys")

_UNKNOWN = object()  # the cache's mark of a secret no key has


@dataclass(frozen=True, slots=True)
class KeySpec:
    """What a key is made of, as the admin API and the CLI give it."""

    name: str
    tenant: str
    models: tuple[str, ...] | None = None
    max_class: RequestClass = RequestClass.INTERACTIVE
    runners: tuple[str, ...] | None = None
    allow_external: bool = False
    limits: Limits = field(default_factory=Limits)
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Issued:
    """A key just created or rotated, with its secret (shown this once)."""

    key: ClientKey
    secret: str


class KeyCache:
    """Offered secret (or a raw ``Authorization`` value that carried one, :meth:`alias`) →
    (principal or unknown, until when it is trusted): bounded, oldest first out (a plain dict
    keeps its insertion order; an entry put again moves to the end)."""

    def __init__(self, ttl_s: float, size: int) -> None:
        self.ttl_s = ttl_s
        self.size = size
        #: key → (value, trusted until): read directly by :meth:`Keys.known_header` only
        self.entries: dict[str | bytes, tuple[object, float]] = {}

    def get(self, key: str | bytes, now: float) -> object | None:
        entry = self.entries.get(key)
        if entry is None or now >= entry[1]:
            return None
        return entry[0]

    def put(self, key: str | bytes, value: object, now: float) -> None:
        self._keep(key, (value, now + self.ttl_s))

    def alias(self, key: str | bytes, existing: str | bytes) -> None:
        """``key`` names the entry of ``existing`` too, trusted until the same moment (so an
        alias never stretches the revocation delay); nothing if there is no such entry."""
        entry = self.entries.get(existing)
        if entry is not None:
            self._keep(key, entry)

    def _keep(self, key: str | bytes, entry: tuple[object, float]) -> None:
        entries = self.entries
        entries.pop(key, None)
        entries[key] = entry
        while len(entries) > self.size:
            del entries[next(iter(entries))]

    def drop(self, key: str | bytes) -> None:
        self.entries.pop(key, None)

    def __len__(self) -> int:
        return len(self.entries)


class Keys:
    """The client keys of a gateway."""

    def __init__(
        self,
        store: Store,
        config: Callable[[], GatewayConfig],
        clock: Clock,
        *,
        looked_up: Callable[[ClientKey], None] | None = None,
    ) -> None:
        self._store = store
        self._config = config
        self._clock = clock
        auth = config().auth
        self._cache = KeyCache(auth.key_cache_s, auth.max_keys_cached)
        self._unknown = KeyCache(auth.key_cache_s, auth.max_keys_cached)  # secrets no key has
        #: cache key → its store lookup running now (bounded by the requests in flight)
        self._lookups: dict[str, asyncio.Task[object]] = {}
        #: told each key a lookup found (its limits may have changed: the quota's leases)
        self.looked_up = looked_up

    @property
    def enforced(self) -> bool:
        """Whether requests need a key (``auth.mode: keys``)."""
        return self._config().auth.mode == "keys"

    def known(self, secret: str | None) -> Principal | None:
        """:meth:`authenticate`'s answer from this replica's cache alone, without an await;
        None when the secret is not cached (then :meth:`authenticate` asks the store)."""
        if not secret or not secret.startswith(SECRET_PREFIX):
            raise Unauthorized("a client key is required (Authorization: Bearer <key>)")
        cached, now = _cache_key(secret), self._clock.monotonic()
        found = self._cache.get(cached, now)
        if found is None:
            found = self._unknown.get(cached, now)
        return None if found is None else self._let_in(found)

    def known_header(self, authorization: bytes) -> Principal | None:
        """:meth:`known` for a request's raw ``Authorization`` value, when that value was seen
        before with a real key (:meth:`authenticate_header`): one dict lookup, no parse of the
        header, no decode; None when it is not cached."""
        entry = self._cache.entries.get(authorization)  # KeyCache.get, inlined: once a request
        if entry is None or self._clock.monotonic() >= entry[1]:
            return None
        found = entry[0]
        return found if type(found) is Principal and not found.dated else self._let_in(found)

    async def authenticate_header(self, authorization: bytes, secret: str | None) -> Principal:
        """:meth:`authenticate` of the ``secret`` a raw ``Authorization`` value offers; a real
        key's value is remembered beside its secret, with the same expiry, for
        :meth:`known_header` (a wrong key's never: the cache of real keys stays theirs)."""
        principal = await self.authenticate(secret)
        if secret is not None and len(authorization) <= MAX_CACHED_SECRET:
            self._cache.alias(authorization, secret)
        return principal

    async def authenticate(self, secret: str | None) -> Principal:
        """The principal of a request offering ``secret``; :class:`Unauthorized` for none, a
        wrong, a revoked or an expired key (the message never repeats the secret)."""
        cached = self.known(secret)
        if cached is not None:
            return cached
        assert secret is not None  # known() refused it otherwise
        name = _cache_key(secret)
        lookup = self._lookups.get(name)
        if lookup is None:  # the first miss: the others wait for its answer
            lookup = self._lookups[name] = asyncio.ensure_future(self._look_up(secret, name))
            lookup.add_done_callback(lambda done: self._looked_up(name, done))
        return self._let_in(await asyncio.shield(lookup))

    async def _look_up(self, secret: str, cached: str) -> object:
        """The store's answer for ``secret`` (only on a miss), cached: a principal, or
        ``_UNKNOWN``."""
        stored = await self._store.key_by_digest(digest(secret))
        found = _UNKNOWN if stored is None else Principal(stored)
        if stored is not None and self.looked_up is not None:
            self.looked_up(stored)
        cache = self._unknown if stored is None else self._cache
        cache.put(cached, found, self._clock.monotonic())
        return found

    def _looked_up(self, cached: str, done: asyncio.Task[object]) -> None:
        if self._lookups.get(cached) is done:
            del self._lookups[cached]
        if not done.cancelled():
            done.exception()  # retrieved: a failed lookup whose waiters all left logs nothing

    def _let_in(self, found: object) -> Principal:
        if type(found) is not Principal:
            raise Unauthorized("unknown client key")
        if found.dated:  # else: no clock read
            refusal = found.key.refusal(self._clock.now())
            if refusal is not None:
                raise Unauthorized(f"{refusal} ({found.key.prefix}…)")
        return found

    async def create(self, spec: KeySpec, *, actor: str) -> Issued:
        secret = new_secret()
        key = _key_of(spec, new_key_id(), prefix_of(secret))
        stored = await self._store.create_key(key, digest(secret), actor=actor)
        return Issued(stored, secret)

    async def get(self, key_id: str) -> ClientKey | None:
        return await self._store.get_key(key_id)

    async def all(self, *, tenant: str | None = None) -> list[ClientKey]:
        return await self._store.list_keys(tenant=tenant)

    async def update(self, key_id: str, changes: Mapping[str, Any], *, actor: str) -> ClientKey:
        """Change the named fields of a key (``limits`` replaced whole); audited. Like a
        rotation or a revocation it takes effect on this replica at once."""
        key = await self._existing(key_id)
        fields = dict(changes.items())
        if "limits" in fields and not isinstance(fields["limits"], Limits):
            fields["limits"] = Limits.of(fields["limits"])
        saved = await self._store.save_key(replace(key, **fields), actor=actor, action=KEY_UPDATED)
        self._forget()  # this replica: at once
        return _found(saved, key_id)

    async def rotate(self, key_id: str, *, actor: str) -> Issued:
        """A new secret for the key (the old one stops working at once here, within
        ``auth.key_cache_s`` elsewhere); usage, limits and id stay."""
        key = await self._existing(key_id)
        if key.revoked_at is not None:
            raise KeyRevoked(f"key {key_id!r} is revoked: create a new key instead")
        secret = new_secret()
        rotated = replace(key, prefix=prefix_of(secret))
        saved = await self._store.save_key(
            rotated, actor=actor, action=KEY_ROTATED, digest=digest(secret)
        )
        self._forget()  # this replica: at once
        return Issued(_found(saved, key_id), secret)

    async def revoke(self, key_id: str, *, actor: str) -> ClientKey:
        key = await self._existing(key_id)
        if key.revoked_at is not None:
            return key
        revoked = replace(key, revoked_at=self._clock.now())
        saved = await self._store.save_key(revoked, actor=actor, action=KEY_REVOKED)
        self._forget()  # this replica: at once
        return _found(saved, key_id)

    def _forget(self) -> None:
        """Drop every key this replica trusts (after a change to one here: it takes effect at
        once on this replica, within ``auth.key_cache_s`` on the others)."""
        self._cache = KeyCache(self._cache.ttl_s, self._cache.size)
        self._lookups = {}  # a lookup begun before it is not waited for after it

    async def _existing(self, key_id: str) -> ClientKey:
        return _found(await self._store.get_key(key_id), key_id)

    async def load_bootstrap(self, environ: Mapping[str, str]) -> list[str]:
        """Store the keys of ``auth.bootstrap_keys_env``; their ids."""
        name = self._config().auth.bootstrap_keys_env
        raw = environ.get(name) if name else None
        if not raw:
            return []
        ids = []
        for spec, secret in parse_bootstrap(raw, name or ""):
            key = _key_of(spec, f"boot-{spec.name}", prefix_of(secret))
            await self._store.put_bootstrap_key(key, digest(secret))
            ids.append(key.id)
        log.info("bootstrap client keys stored: %s", ", ".join(ids))
        return ids

    def __repr__(self) -> str:
        return f"<Keys mode={self._config().auth.mode} cached={len(self._cache)}>"


#: Longer offered secrets are cached by their digest: a flood of long wrong ones must not fill
#: ``auth.max_keys_cached`` entries with header-sized strings (a generated secret has 46 chars).
MAX_CACHED_SECRET = 128


def _cache_key(secret: str) -> str:
    return secret if len(secret) <= MAX_CACHED_SECRET else digest(secret)


def _found(key: ClientKey | None, key_id: str) -> ClientKey:
    if key is None:
        raise KeyNotFound(f"no client key {key_id!r}")
    return key


def _key_of(spec: KeySpec, key_id: str, prefix: str) -> ClientKey:
    return ClientKey(
        id=key_id,
        name=spec.name,
        tenant=spec.tenant,
        prefix=prefix,
        models=spec.models,
        max_class=spec.max_class,
        runners=spec.runners,
        allow_external=spec.allow_external,
        limits=spec.limits,
        expires_at=spec.expires_at,
    )


#: The fields of a bootstrap entry: those of ``POST /admin/keys`` and ``key``, the secret.
BOOTSTRAP_FIELDS = (
    "name", "tenant", "key", "models", "max_class", "runners", "allow_external", "limits",
    "expires_at",
)  # fmt: skip


def parse_bootstrap(raw: str, env: str) -> list[tuple[KeySpec, str]]:
    """The bootstrap keys in ``raw`` (a JSON list); :class:`ConfigError` naming the variable
    and the entry, never the secret. Each entry is checked as ``POST /admin/keys`` checks its
    body: unknown fields, types and values are refused, naming the field."""
    try:
        entries = json.loads(raw)
    except ValueError as exc:
        raise _problem(env, "is not JSON (expected a list of key objects)") from exc
    if not isinstance(entries, list):
        raise _problem(env, "expected a JSON list of key objects")
    return [_bootstrap_entry(entry, f"{env}[{index}]") for index, entry in enumerate(entries)]


def _problem(where: str, message: str) -> ConfigError:
    return ConfigError([ConfigProblem(where, message)], source="environment")


def _bootstrap_entry(entry: object, where: str) -> tuple[KeySpec, str]:
    """One bootstrap entry (``where``: its place, ``VAR[0]``) as a key and its secret."""
    if not isinstance(entry, dict):
        raise _problem(where, "expected an object")
    for unknown in (name for name in entry if name not in BOOTSTRAP_FIELDS):
        raise _problem(
            f"{where}.{unknown}", f"unknown key (allowed: {', '.join(BOOTSTRAP_FIELDS)})"
        )
    secret, name, tenant = entry.get("key"), entry.get("name"), entry.get("tenant")
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise _problem(f"{where}.key", f"expected a secret starting with {SECRET_PREFIX}")
    if len(secret) < PREFIX_LENGTH + 16:
        raise _problem(f"{where}.key", f"too short: at least {PREFIX_LENGTH + 16} characters")
    if not isinstance(name, str) or not name or not isinstance(tenant, str) or not tenant:
        raise _problem(where, "needs a `name` and a `tenant` (non-empty strings)")
    if TENANT_NAME.fullmatch(tenant) is None:
        raise _problem(f"{where}.tenant", "expected 1-64 letters, digits, '.', '_' or '-'")
    try:
        cls = RequestClass(entry.get("max_class", "interactive"))
    except ValueError as exc:
        raise _problem(f"{where}.max_class", "expected system, interactive or batch") from exc
    allow_external = entry.get("allow_external", False)
    if not isinstance(allow_external, bool):
        raise _problem(f"{where}.allow_external", "expected true or false")
    try:
        expires_at = entry.get("expires_at")
        expires = None if expires_at is None else parse_rfc3339(expires_at)
    except ValueError as exc:
        raise _problem(f"{where}.expires_at", str(exc)) from exc
    spec = KeySpec(
        name=name,
        tenant=tenant,
        models=_names(entry.get("models"), f"{where}.models"),
        max_class=cls,
        runners=_names(entry.get("runners"), f"{where}.runners"),
        allow_external=allow_external,
        limits=_limits(entry.get("limits"), f"{where}.limits"),
        expires_at=expires,
    )
    return spec, secret


def _names(value: object, where: str) -> tuple[str, ...] | None:
    """A bootstrap entry's ``models`` or ``runners``: a list of names, or null (every one)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _problem(where, "expected a list of names, or null")
    return tuple(value)


def _limits(value: object, where: str) -> Limits:
    """A bootstrap entry's ``limits`` as ``POST /admin/keys`` takes them: each a whole number
    of at least 1 (``daily_cents``: a number of at least 0), or null."""
    if value is None:
        return Limits()
    if not isinstance(value, dict):
        raise _problem(where, "expected an object of limits, or null")
    for name, limit in value.items():
        if name not in LIMIT_NAMES:
            raise _problem(f"{where}.{name}", f"unknown key (allowed: {', '.join(LIMIT_NAMES)})")
        cents = name == "daily_cents"
        kinds = (int, float) if cents else (int,)
        if limit is None:
            continue
        if isinstance(limit, bool) or not isinstance(limit, kinds) or limit < (0 if cents else 1):
            what = "a number of at least 0" if cents else "a whole number of at least 1"
            raise _problem(f"{where}.{name}", f"expected {what}, or null (unlimited)")
    return Limits.of(value)
