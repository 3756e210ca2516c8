from __future__ import annotations

import pytest

from gpugate.core.classes import RequestClass, parse_request_class
from gpugate.errors import BadRequest


def test_system_outranks_interactive_which_outranks_batch() -> None:
    expected = [RequestClass.SYSTEM, RequestClass.INTERACTIVE, RequestClass.BATCH]

    assert expected == sorted(RequestClass, key=lambda cls: cls.priority, reverse=True)


def test_a_class_is_its_wire_value() -> None:
    expected = ["system", "interactive", "batch"]

    assert expected == [str(cls) for cls in RequestClass]


@pytest.mark.parametrize("value", [None, "", "  "])
def test_a_missing_or_empty_header_gives_the_default(value: str | None) -> None:
    expected = RequestClass.BATCH

    assert expected == parse_request_class(value, default=expected)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("system", RequestClass.SYSTEM),
        ("Interactive", RequestClass.INTERACTIVE),
        ("BATCH", RequestClass.BATCH),
        (" batch ", RequestClass.BATCH),
    ],
)
def test_the_header_is_read_case_insensitively(value: str, expected: RequestClass) -> None:
    assert expected == parse_request_class(value, default=RequestClass.INTERACTIVE)


def test_an_unknown_class_is_a_bad_request_naming_the_valid_values() -> None:
    with pytest.raises(BadRequest) as caught:
        parse_request_class("urgent", default=RequestClass.INTERACTIVE)

    expected = "X-Request-Class must be one of system, interactive, batch; got 'urgent'"
    assert expected == caught.value.message
    assert caught.value.code == "BAD_REQUEST"
