"""The keyed hot path's shortcuts give the same answers as the long way (issue #21): the body
parsed once for the key check and the data plane, the usage option's document built rather than
parsed, the limit windows made once a minute."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from gpugate.config import GatewayConfig
from gpugate.config.loader import parse_config
from gpugate.core.limits import Price
from gpugate.core.usage import with_include_usage, with_include_usage_doc
from gpugate.errors import BadRequest
from gpugate.services.limits import Quota, prices_of
from gpugate.web.auth import _served_externally
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
def test_the_usage_options_document_is_what_its_bytes_parse_to(doc: dict[str, object]) -> None:
    body = json.dumps(doc).encode()
    assert with_include_usage_doc(doc) == json.loads(with_include_usage(doc, body))
    assert list(with_include_usage_doc(doc)) == list(json.loads(with_include_usage(doc, body)))


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
    assert _served_externally(_config(external=True)) == {"m", "n"}
    assert _served_externally(_config(external=False)) == frozenset()
