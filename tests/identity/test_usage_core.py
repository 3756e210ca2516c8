"""The pure usage helpers: asking upstream for usage, finding it, hiding what asking added."""

from __future__ import annotations

import json

import pytest

from gpugate.core.usage import (
    _NULL_USAGE,
    StreamUsage,
    Usage,
    json_usage,
    with_include_usage,
)


def test_include_usage_is_written_into_the_body_keeping_every_other_byte() -> None:
    body = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"}"}]}'
    asked = with_include_usage(json.loads(body), body)
    assert asked is not None
    assert asked.startswith(body[:-1])
    assert {"include_usage": True} == json.loads(asked)["stream_options"]


def test_existing_stream_options_are_kept_when_include_usage_is_added() -> None:
    body = b'{"model":"m","stream_options":{"continuous_usage_stats":false}}'
    asked = with_include_usage(json.loads(body), body)
    assert asked is not None
    options = json.loads(asked)["stream_options"]
    assert {"continuous_usage_stats": False, "include_usage": True} == options


def test_a_json_body_s_usage_is_its_last_usage_object() -> None:
    body = (
        b'{"choices":[{"text":"\\"usage\\": {"}],"usage":{"prompt_tokens":3,"completion_tokens":4}}'
    )
    assert Usage(3, 4) == json_usage(body)
    assert json_usage(b'{"usage":null}') is None


def test_a_json_body_s_usage_is_read_whatever_it_nests_and_only_when_its_counts_are_whole() -> None:
    nested = b'{"usage":{"prompt_tokens":3,"completion_tokens":4,"details":{"cached":1}}}'
    assert Usage(3, 4) == json_usage(nested)
    assert Usage(3, 0) == json_usage(b'{"usage": {"prompt_tokens": 3}}')
    assert json_usage(b'{"usage":{"prompt_tokens":3.5,"completion_tokens":4}}') is None
    assert json_usage(b'{"usage":{"prompt_tokens":3,"completion_tokens":') is None  # cut off
    assert json_usage(b'{"usage":{"prompt_tokens":3,"x":"\xff"}}') is None  # not UTF-8


def test_a_hidden_usage_chunk_and_its_nulls_are_taken_out_across_split_chunks() -> None:
    plain = b'data: {"id":"x","choices":[{"delta":{"content":"hi"}}]}\n\n'
    asked = b'data: {"id":"x","usage":null,"choices":[{"delta":{"content":"hi"}}]}\n\n'
    usage = b'data: {"id":"x","usage":{"prompt_tokens":2,"completion_tokens":1},"choices":[]}\n\n'
    done = b"data: [DONE]\n\n"
    watch = StreamUsage(hide=True)
    stream = asked + usage + done
    out = b"".join(watch.feed(stream[i : i + 7]) for i in range(0, len(stream), 7))
    out += watch.flush()
    assert plain + done == out
    assert Usage(2, 1) == watch.usage


def test_a_stream_the_client_asked_usage_of_passes_unchanged_and_is_read() -> None:
    usage = b'data: {"usage":{"prompt_tokens":5,"completion_tokens":6},"choices":[]}\n\n'
    watch = StreamUsage(hide=False)
    assert usage == watch.feed(usage)
    assert Usage(5, 6) == watch.usage


@pytest.mark.parametrize(
    "event",
    [
        b'data: {"id":"x","usage":null,"choices":[{"delta":{"content":"hi"}}]}\n\n',
        b'data: {"id":"x","choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n',
        b'data: {"id": "x", "usage": null, "choices": [{"delta": {"content": "hi"}}]}\n\n',
        b'data: {"id":"x","choices":[],"usage" :null }\n\n',
        b'data: {"usage":null}\n\n',
        b'data: {"id":"x","usage":null,"choices":[]}\n\ndata: {"id":"y","usage": null}\n\n',
    ],
)
def test_the_nulls_asking_added_are_cut_as_the_general_rule_cuts_them(event: bytes) -> None:
    """The compact form, cut by a byte replace, gives what the regex gives for every form."""
    hidden, asked = StreamUsage(hide=True), StreamUsage(hide=False)
    assert _NULL_USAGE.sub(b"", event) == hidden.feed(event)
    assert event == asked.feed(event)
    assert (None, None) == (hidden.usage, asked.usage)


def test_a_usage_chunk_after_null_chunks_is_read_whether_or_not_it_is_hidden() -> None:
    nulls = b'data: {"id":"x","usage":null,"choices":[{"delta":{"content":"hi"}}]}\n\n' * 3
    usage = b'data: {"id":"x","usage":{"prompt_tokens":2,"completion_tokens":3},"choices":[]}\n\n'
    for hide in (True, False):
        watch = StreamUsage(hide=hide)
        for part in (nulls, usage, b"data: [DONE]\n\n"):
            watch.feed(part)
        assert Usage(2, 3) == watch.usage
