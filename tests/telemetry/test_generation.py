"""What :class:`gpugate.telemetry.Generation` reads off a relayed answer: pure, no sockets."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from gpugate.telemetry import Generation


def event(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def token(word: str, model: str = "qwen") -> bytes:
    return event({"model": model, "choices": [{"index": 0, "delta": {"content": word}}]})


USAGE = event({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3}})
DONE = b"data: [DONE]\n\n"


def clock(*readings: float) -> Callable[[], float]:
    """A clock answering ``readings`` in turn (Generation reads it at the first data event and
    at the end)."""
    times = iter(readings)
    return lambda: next(times)


def test_time_to_first_token_runs_from_arrival_to_the_first_data_event_not_a_comment() -> None:
    seen = Generation(10.0, clock(10.5, 10.7), stream=True)
    seen.chunk(b": keep-alive\n\n")
    seen.chunk(token("a"))
    seen.chunk(token("b"))
    assert 0.5 == seen.finish().ttft


def test_time_per_output_token_spreads_the_time_after_the_first_over_the_tokens_after_it() -> None:
    seen = Generation(0.0, clock(1.0, 1.8), stream=True)
    for word in "abcde":
        seen.chunk(token(word))
    seen.chunk(DONE)
    told = seen.finish()
    assert (5, None) == (told.output_tokens, told.input_tokens)
    assert abs(0.2 - (told.time_per_output_token or 0)) < 1e-9


def test_a_streams_usage_event_gives_the_exact_counts() -> None:
    seen = Generation(0.0, clock(1.0, 5.0), stream=True)
    for chunk in (token("a"), token("b"), token("c"), event({"choices": []})):
        seen.chunk(chunk)
    seen.chunk(USAGE + DONE)
    told = seen.finish()
    assert (12, 3) == (told.input_tokens, told.output_tokens)
    assert 2.0 == told.time_per_output_token  # (5 - 1) s over the 2 tokens after the first


def test_a_json_answer_has_usage_and_a_model_but_no_first_token() -> None:
    body = json.dumps(
        {
            "id": "x",
            "model": "qwen-7b",
            "choices": [{"message": {"content": "hello"}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
        }
    ).encode()
    seen = Generation(0.0, clock(1.1), stream=False)
    seen.chunk(body[:20])  # the model's name is in the second piece
    seen.chunk(body[20:])
    told = seen.finish()
    assert (None, None, 9, 4, "qwen-7b") == (
        told.ttft,
        told.time_per_output_token,
        told.input_tokens,
        told.output_tokens,
        told.model,
    )


def test_usage_split_across_two_chunks_is_still_found() -> None:
    seen = Generation(0.0, clock(1.0, 1.2), stream=True)
    seen.chunk(token("a"))
    seen.chunk(USAGE[:30])
    seen.chunk(USAGE[30:] + DONE)
    assert 3 == seen.finish().output_tokens


def test_an_answer_without_usage_or_events_tells_nothing_and_holds_only_its_last_pieces() -> None:
    empty = Generation(0.0, clock(1.0), stream=False)
    pieces = [bytes([65 + n]) * 1000 for n in range(10)]
    for piece in pieces:
        empty.chunk(piece)
    assert (pieces[0], pieces[-3:]) == (empty._head, [empty._a, empty._b, empty._c])
    told = empty.finish(model=False)
    assert (None, None, None, None, None) == (
        told.ttft,
        told.time_per_output_token,
        told.input_tokens,
        told.output_tokens,
        told.model,
    )


def test_a_one_token_stream_has_a_first_token_but_no_time_per_token() -> None:
    seen = Generation(0.0, clock(0.3, 0.3), stream=True)
    seen.chunk(token("a") + DONE)
    told = seen.finish()
    assert (0.3, 1, None) == (told.ttft, told.output_tokens, told.time_per_output_token)
