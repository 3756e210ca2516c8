"""JSON bodies become data one way, and only data every store and every JSON reader can hold."""

from __future__ import annotations

import json

import pytest

from gpugate.config.untrusted import MAX_DEPTH
from gpugate.errors import BadRequest
from gpugate.web.bodies import json_document


def refusal(raw: bytes | str) -> str:
    with pytest.raises(BadRequest) as caught:
        json_document(raw)
    return caught.value.message


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_an_ordinary_body_is_its_data() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo 😀"}], "n": 1.5}

    assert body == json_document(json.dumps(body).encode())


def test_a_surrogate_pair_escape_is_one_character_and_accepted() -> None:
    assert {"emoji": "😀"} == json_document(b'{"emoji": "\\ud83d\\ude00"}')


def test_nesting_up_to_the_limit_is_accepted_and_one_level_more_is_refused() -> None:
    assert json_document(nested(MAX_DEPTH)) is not None
    assert f"the request body: nested deeper than {MAX_DEPTH} levels" == refusal(
        nested(MAX_DEPTH + 1)
    )


def test_json_deep_enough_to_exhaust_the_parser_is_a_bad_request_not_a_recursion_error() -> None:
    assert refusal(nested(100_000)).startswith("the request body is not valid JSON: nested")


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_refused_naming_their_key_path(number: str) -> None:
    message = refusal(f'{{"input": {{"xs": [1, {number}]}}}}')

    assert message.startswith("input.xs[1]: expected a finite number, got ")


def test_a_nul_character_in_a_value_is_refused_naming_its_key_path() -> None:
    assert "input.messages[0].content: text holds a NUL character (\\u0000)" == refusal(
        b'{"input": {"messages": [{"content": "a\\u0000b"}]}}'
    )


def test_a_nul_character_in_a_key_is_refused_naming_the_object_holding_it() -> None:
    assert "input: a key holds a NUL character (\\u0000)" == refusal(b'{"input": {"a\\u0000": 1}}')


@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "\\ude00\\ud83d"])
def test_a_lone_surrogate_is_refused(escape: str) -> None:
    assert "reason: text holds a lone UTF-16 surrogate (not a character)" == refusal(
        f'{{"reason": "x{escape}"}}'
    )


def test_malformed_json_and_bytes_that_are_not_utf8_are_bad_requests() -> None:
    assert refusal(b'{"model": ').startswith("the request body is not valid JSON: ")
    assert refusal(b'{"model": "\xff"}').startswith("the request body is not valid JSON: ")
