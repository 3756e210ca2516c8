"""The keyed hot path's shortcuts give the same answers as the long way (issue #21): the body
parsed once for the key check and the data plane, the usage option's document built rather than
parsed, the limit windows made once a minute."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from gpugate.core.limits import windows
from gpugate.core.usage import with_include_usage, with_include_usage_doc
from gpugate.errors import BadRequest
from gpugate.web.bodies import hand_over, json_document


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


def test_a_handed_document_is_returned_for_the_very_same_bytes_once() -> None:
    body = b'{"model": "m"}'
    handed = {"model": "m", "handed": True}
    hand_over(body, handed)
    assert json_document(bytes(bytearray(body))) == {"model": "m"}  # equal bytes: parsed
    assert json_document(body) is handed
    assert json_document(body) == {"model": "m"}  # once: parsed again after


def test_a_handed_document_never_skips_the_checks_of_other_bytes() -> None:
    hand_over(b'{"model": "m"}', {"model": "m"})
    with pytest.raises(BadRequest, match="NUL"):
        json_document(b'{"model": "m\\u0000"}')


def test_limit_windows_are_made_once_a_minute() -> None:
    a = windows(datetime(2026, 12, 1, 13, 20, 5, tzinfo=UTC))
    b = windows(datetime(2026, 12, 1, 13, 20, 59, 999_999, tzinfo=UTC))
    c = windows(datetime(2026, 12, 1, 13, 21, tzinfo=UTC))
    assert a is b
    assert (a.minute, a.day) == ("2026-12-01T13:20", "2026-12-01")
    assert (c.minute, c.day) == ("2026-12-01T13:21", "2026-12-01")
    assert windows(datetime(2026, 12, 2, 13, 21, tzinfo=UTC)).day == "2026-12-02"
