"""The answers' wire shapes are deterministic and self-consistent."""

from __future__ import annotations

import json

import pytest

from gpugate.fleet.replies import (
    Completion,
    InvalidRequestError,
    answer_text,
    completion_prompts,
    cut,
    embedding,
)


@pytest.mark.parametrize(("text", "pieces"), [("alpha answers: hi", 8), ("ab", 5), ("x" * 9, 9)])
def test_cut_gives_exactly_that_many_non_empty_pieces_that_join_to_the_text(
    text: str, pieces: int
) -> None:
    parts = cut(text, pieces)

    assert pieces == len(parts)
    assert all(parts)
    assert text.ljust(pieces) == "".join(parts)


def test_the_answer_names_the_server_and_echoes_at_most_32_words() -> None:
    assert "s answers." == answer_text("s", "   ")
    assert 2 + 32 == len(answer_text("s", "w " * 100).split())


def test_embeddings_are_deterministic_bounded_and_input_dependent() -> None:
    first, again, other = embedding("a", 16), embedding("a", 16), embedding("b", 16)

    assert first == again
    assert first != other
    assert all(-1.0 <= x <= 1.0 for x in first)


def test_a_text_completion_has_one_choice_per_prompt_and_streams_them_interleaved() -> None:
    prompts = completion_prompts({"prompt": ["one", "two"]})
    pieces = tuple(cut(answer_text("s", p), 2) for p in prompts)
    completion = Completion("text", "cmpl-1", 0, "m", pieces, 2)

    body = json.loads(completion.body())
    steps = [
        json.loads(e.removeprefix(b"data: ")) for e in completion.stream(include_usage=False).steps
    ]

    assert ["s answers: one", "s answers: two"] == [c["text"] for c in body["choices"]]
    assert [0, 1, 0, 1] == [step["choices"][0]["index"] for step in steps]
    assert 4 == body["usage"]["completion_tokens"]


def test_a_prompt_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="prompt"):
        completion_prompts({"prompt": 3})
