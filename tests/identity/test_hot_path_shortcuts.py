"""The keyed hot path's shortcuts give the same answers as the long way (issues #21, #16 DW5): the
body parsed once for the key check and the data plane, the usage option's document built rather
than parsed, the limit windows made once a minute, the class header worked out once per key, the
principal cached per offered secret."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpugate.clock import ManualClock
from gpugate.config import GatewayConfig
from gpugate.config.loader import parse_config
from gpugate.core.classes import RequestClass, parse_request_class
from gpugate.core.keys import ClientKey, Principal, clamp, digest
from gpugate.core.limits import Price
from gpugate.core.usage import with_include_usage
from gpugate.errors import BadRequest, Unauthorized
from gpugate.services.keys import MAX_CACHED_SECRET, KeyCache, Keys, KeySpec
from gpugate.services.limits import Quota, prices_of
from gpugate.store import Store
from gpugate.store.factory import open_store
from gpugate.store.keys import KEY_REVOKED
from gpugate.web.auth import served_externally
from gpugate.web.bodies import json_document, parsed_body


@pytest.mark.parametrize(
    "doc",
    [
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        {"model": "m", "stream": True, "stream_options": {"include_usage": False, "x": 1}},
        {"model": "m", "stream": True, "stream_options": None},
        {"model": "m", "stream": True, "stream_options": {}, "n": 1.5e300, "e": "\u00e9"},
    ],
)
@pytest.mark.parametrize("trailing", [b"", b" \r\n\t"])
def test_the_usage_options_document_is_what_its_bytes_parse_to(
    doc: dict[str, object], trailing: bytes
) -> None:
    body = json.dumps(doc).encode() + trailing
    doc = json.loads(body)  # the request's own document, which the option is set in
    asked = with_include_usage(doc, body)
    assert asked is not None
    assert doc == json.loads(asked)
    assert list(doc) == list(json.loads(asked))  # the new key last, as written
    assert True is json.loads(asked)["stream_options"]["include_usage"]


def test_a_stream_that_asks_for_usage_itself_is_left_as_it_is() -> None:
    body = b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}'
    doc = json.loads(body)
    assert with_include_usage(doc, body) is None
    assert json.loads(body) == doc


def test_a_body_carrying_its_document_is_not_parsed_again() -> None:
    doc = {"model": "m", "carried": True}
    body = parsed_body(b'{"model": "m"}', doc)
    assert body == b'{"model": "m"}'
    assert json_document(body) is doc
    assert json_document(bytes(body)) == {"model": "m"}  # plain bytes: parsed


def test_a_carried_document_never_skips_the_checks_of_other_bytes() -> None:
    parsed_body(b'{"model": "m"}', {"model": "m"})
    with pytest.raises(BadRequest, match="NUL"):
        json_document(b'{"model": "m\\u0000"}')


def test_limit_windows_are_made_once_a_minute() -> None:
    quota = Quota(None, None, None, lambda _model: None)  # type: ignore[arg-type]
    a = quota._windows(datetime(2026, 12, 1, 13, 20, 5, tzinfo=UTC))
    b = quota._windows(datetime(2026, 12, 1, 13, 20, 59, 999_999, tzinfo=UTC))
    c = quota._windows(datetime(2026, 12, 1, 13, 21, tzinfo=UTC))
    assert a is b
    assert (a.minute, a.day) == ("2026-12-01T13:20", "2026-12-01")
    assert (c.minute, c.day) == ("2026-12-01T13:21", "2026-12-01")
    assert quota._windows(datetime(2026, 12, 2, 13, 21, tzinfo=UTC)).day == "2026-12-02"


def _config(models: str = "", external: bool = False) -> GatewayConfig:
    text = (
        "listen: 127.0.0.1:1\nstore: 'sqlite:///unused.db'\nupstreams:\n"
        f"  - {{id: a, url: 'http://127.0.0.1:9', models: [m, n],"
        f" external: {str(external).lower()}}}\n" + models
    )
    return parse_config(text)


def test_prices_are_read_once_per_config_version_and_follow_a_new_one() -> None:
    first = _config(
        "models:\n  - {name: m, price: {prompt_per_1k_cents: 10, completion_per_1k_cents: 20}}\n"
    )
    current = [first]
    price = prices_of(lambda: current[0])
    assert price("m") == Price(10, 20)
    assert price("n") is None
    current[0] = _config(
        "models:\n  - {name: n, price: {prompt_per_1k_cents: 1, completion_per_1k_cents: 2}}\n"
    )
    assert price("m") is None
    assert price("n") == Price(1, 2)


def test_the_models_of_external_upstreams_are_the_ones_a_key_without_allow_external_loses() -> None:
    assert served_externally(_config(external=True)) == {"m", "n"}
    assert served_externally(_config(external=False)) == frozenset()


@pytest.mark.parametrize("highest", list(RequestClass))
def test_a_principal_s_class_header_is_the_clamp_of_what_was_asked_in_any_spelling(
    highest: RequestClass,
) -> None:
    """Worked out once per key, it says what :func:`clamp` says; none for the default class
    (a request without the header is ``interactive``), 400 for a name of no class."""
    principal = Principal(ClientKey(id="k", name="k", tenant="t", prefix="gk-x", max_class=highest))
    for asked in [None, b"", *(c.value.encode() for c in RequestClass), b" System ", b"BATCH"]:
        wanted = parse_request_class(
            None if asked is None else asked.decode(), default=RequestClass.INTERACTIVE
        )
        clamped = clamp(wanted, highest)
        expected = None if clamped is RequestClass.INTERACTIVE else clamped.value.encode()
        header = principal.class_header(asked)
        assert expected == (None if header is None else header[1]), asked
    with pytest.raises(BadRequest):
        principal.class_header(b"urgent")


def test_the_key_cache_trusts_an_entry_for_its_ttl_and_drops_the_oldest_past_its_size() -> None:
    cache = KeyCache(ttl_s=2.0, size=2)
    cache.put("a", "A", 0.0)
    cache.put("b", "B", 0.5)
    assert ("A", "B") == (cache.get("a", 1.9), cache.get("b", 1.9))
    assert cache.get("a", 2.0) is None  # its TTL is over
    cache.put("a", "A2", 2.0)  # looked up again: the newest now
    cache.put("c", "C", 2.1)
    assert (None, "A2", "C") == (cache.get("b", 2.2), cache.get("a", 2.2), cache.get("c", 2.2))


@dataclass
class _KeysRig:
    clock: ManualClock
    config: GatewayConfig
    store: Store
    keys: Keys


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[_KeysRig]:
    """:class:`Keys` on a real SQLite store, on a clock the test moves."""
    clock = ManualClock(start=datetime(2026, 12, 1, 13, 0, tzinfo=UTC))
    config = _config()
    store = open_store(f"sqlite:///{tmp_path}/keys.db", clock=clock)
    await store.open()
    try:
        await store.migrate()
        yield _KeysRig(clock, config, store, Keys(store, lambda: config, clock))
    finally:
        await store.close()


async def test_a_key_revoked_in_the_store_stops_working_here_once_its_cache_entry_is_over(
    rig: _KeysRig,
) -> None:
    """What another replica's revocation looks like from here: the cached principal is trusted
    for ``auth.key_cache_s``, then the store is asked again."""
    keys, clock, ttl_s = rig.keys, rig.clock, rig.config.auth.key_cache_s
    issued = await keys.create(KeySpec(name="k", tenant="t"), actor="test")
    first = await keys.authenticate(issued.secret)
    revoked = replace(issued.key, revoked_at=clock.now())
    await rig.store.save_key(revoked, actor="elsewhere", action=KEY_REVOKED)  # not through keys
    clock.advance(ttl_s / 2)
    assert first is await keys.authenticate(issued.secret)  # the same principal, cached
    clock.advance(ttl_s / 2)
    with pytest.raises(Unauthorized, match="revoked"):
        await keys.authenticate(issued.secret)


async def test_a_long_offered_secret_is_cached_as_its_digest_and_still_refused(
    rig: _KeysRig,
) -> None:
    """A flood of header-sized wrong keys fills the cache with digests, not with the headers."""
    long = "gk-" + "x" * (MAX_CACHED_SECRET * 64)
    for _ in range(2):  # a lookup, then a cache hit
        with pytest.raises(Unauthorized, match="unknown"):
            await rig.keys.authenticate(long)
    assert [digest(long)] == list(rig.keys._unknown.entries)


async def test_a_flood_of_wrong_keys_never_pushes_a_real_key_out_of_the_cache(
    rig: _KeysRig,
) -> None:
    """Unknown secrets are cached apart: past ``auth.max_keys_cached`` wrong keys, a real key is
    still answered from the cache (no await, no store lookup) and every wrong key still refused."""
    keys, size = rig.keys, rig.config.auth.max_keys_cached
    issued = await keys.create(KeySpec(name="k", tenant="t"), actor="test")
    principal = await keys.authenticate(issued.secret)
    for n in range(size + 10):
        with pytest.raises(Unauthorized, match="unknown"):
            await keys.authenticate(f"gk-wrong-{n}")
    assert principal is keys.known(issued.secret)  # still cached
    assert len(keys._unknown) == size  # bounded
    with pytest.raises(Unauthorized, match="unknown"):
        keys.known(f"gk-wrong-{size + 9}")  # the newest: cached


class _CountedLookups:
    """The store's ``key_by_digest``, counted, each call held until the test lets it go (the
    lookups a burst of requests would start while one is on the store's thread)."""

    def __init__(self, store: Store) -> None:
        self.real = store.key_by_digest
        self.calls = 0
        self.go = asyncio.Event()

    async def __call__(self, key_digest: str) -> ClientKey | None:
        self.calls += 1
        await self.go.wait()
        return await self.real(key_digest)


async def test_requests_that_miss_the_cache_together_wait_for_one_store_lookup(
    rig: _KeysRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once an entry's delay is over, every request of the key in flight misses it at once: the
    store is asked once, and every one of them gets its answer (a wrong key's too)."""
    keys = rig.keys
    issued = await keys.create(KeySpec(name="k", tenant="t"), actor="test")
    lookups = _CountedLookups(rig.store)
    monkeypatch.setattr(rig.store, "key_by_digest", lookups)
    real = [asyncio.ensure_future(keys.authenticate(issued.secret)) for _ in range(64)]
    wrong = [asyncio.ensure_future(keys.authenticate("gk-wrong")) for _ in range(8)]
    await asyncio.sleep(0)
    lookups.go.set()
    principals = await asyncio.gather(*real)
    refused = await asyncio.gather(*wrong, return_exceptions=True)
    assert 2 == lookups.calls  # one per secret
    assert {issued.key.id} == {p.key.id for p in principals}
    assert all(isinstance(r, Unauthorized) for r in refused)
    assert {} == keys._lookups  # none left behind
    rig.clock.advance(rig.config.auth.key_cache_s)
    await keys.authenticate(issued.secret)
    assert 3 == lookups.calls  # the delay over: asked again


async def test_a_request_that_leaves_during_the_shared_lookup_does_not_cancel_it_for_the_others(
    rig: _KeysRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = rig.keys
    issued = await keys.create(KeySpec(name="k", tenant="t"), actor="test")
    lookups = _CountedLookups(rig.store)
    monkeypatch.setattr(rig.store, "key_by_digest", lookups)
    first = asyncio.ensure_future(keys.authenticate(issued.secret))  # starts the lookup
    second = asyncio.ensure_future(keys.authenticate(issued.secret))
    await asyncio.sleep(0)
    first.cancel()  # its client left
    await asyncio.sleep(0)
    lookups.go.set()
    assert issued.key.id == (await second).key.id
    assert first.cancelled()
    assert 1 == lookups.calls
    assert keys.known(issued.secret) is not None  # cached for the next request


async def test_a_request_after_a_revocation_here_does_not_wait_for_a_lookup_begun_before_it(
    rig: _KeysRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = rig.keys
    issued = await keys.create(KeySpec(name="k", tenant="t"), actor="test")
    lookups = _CountedLookups(rig.store)
    monkeypatch.setattr(rig.store, "key_by_digest", lookups)
    before = asyncio.ensure_future(keys.authenticate(issued.secret))
    await asyncio.sleep(0)
    await keys.revoke(issued.key.id, actor="test")
    after = asyncio.ensure_future(keys.authenticate(issued.secret))
    await asyncio.sleep(0)
    lookups.go.set()
    await asyncio.gather(before, return_exceptions=True)  # raced the revocation: either answer
    with pytest.raises(Unauthorized, match="revoked"):
        await after
    assert 2 == lookups.calls
