"""The approximate prefix index: chained block hashes, longest leading run, bounded, per model."""

from __future__ import annotations

from typing import Any

from gpugate.core.prefix_index import (
    HEAD_CACHE,
    HEAD_CACHE_CHARS,
    MAX_ENDPOINTS_PER_BLOCK,
    PrefixIndex,
    block_hashes,
    prompt_text,
)

A, B, C = "http://a", "http://b", "http://c"


def chat(*contents: str) -> dict[str, Any]:
    roles = ["system", "user", "assistant"]
    return {"messages": [{"role": roles[min(i, 2)], "content": c} for i, c in enumerate(contents)]}


def index(**kwargs: Any) -> PrefixIndex:
    return PrefixIndex(block_chars=16, **kwargs)


def test_a_request_matches_the_longest_run_of_leading_blocks_an_endpoint_received() -> None:
    idx = index()
    system = "s" * 64  # four blocks of 16 with its role header
    idx.record("m", idx.hashes(chat(system, "first question, long enough")), A)
    idx.record("m", idx.hashes(chat("another system prompt entirely!!" * 2, "q")), B)

    runs = idx.match("m", idx.hashes(chat(system, "second question, also long")))

    assert {A: len(block_hashes("system\x00" + system, 16))} == runs


def test_a_block_is_named_by_everything_before_it() -> None:
    one = block_hashes("x" * 16 + "y" * 16, 16)
    two = block_hashes("z" * 16 + "y" * 16, 16)

    assert one[1] != two[1]


def test_the_next_turn_of_a_chat_matches_the_whole_previous_turn() -> None:
    idx = index()
    turn_one = chat("be brief", "what is a GPU?")
    idx.record("m", idx.hashes(turn_one), A)
    turn_two = chat("be brief", "what is a GPU?", "a processor", "and a TPU?")

    assert {A: len(idx.hashes(turn_one))} == idx.match("m", idx.hashes(turn_two))


def test_models_do_not_share_an_index() -> None:
    idx = index()
    hashes = idx.hashes(chat("the same prompt for two models"))
    idx.record("m1", hashes, A)

    assert {} == idx.match("m2", hashes)


def test_the_index_is_bounded_per_model_and_forgets_the_least_recently_used() -> None:
    idx = index(max_blocks=8)
    old = idx.hashes({"prompt": "o" * 16 * 6})
    new = idx.hashes({"prompt": "n" * 16 * 6})
    idx.record("m", old, A)
    idx.record("m", new, B)

    assert 8 == len(idx)
    assert {} == idx.match("m", old)  # its first blocks went first: no leading run left
    assert {B: 6} == idx.match("m", new)


def test_a_block_remembers_only_the_newest_few_endpoints() -> None:
    idx = index()
    hashes = idx.hashes({"prompt": "p" * 32})
    urls = [f"http://e{i}" for i in range(MAX_ENDPOINTS_PER_BLOCK + 2)]
    for url in urls:
        idx.record("m", hashes, url)

    assert set(urls[-MAX_ENDPOINTS_PER_BLOCK:]) == set(idx.match("m", hashes))


def test_a_forgotten_endpoint_matches_nothing() -> None:
    idx = index()
    hashes = idx.hashes({"prompt": "q" * 48})
    idx.record("m", hashes, A)
    idx.record("m", hashes, C)
    idx.forget(A)

    assert {C: 3} == idx.match("m", hashes)


def test_only_chat_messages_and_string_prompts_are_rendered() -> None:
    assert prompt_text({"input": "embed me"}) is None
    assert prompt_text({"prompt": [1, 2, 3]}) is None
    assert prompt_text(None) is None
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert "user\x00hi\x1e" == prompt_text(parts)


def test_cached_system_prompt_hashes_equal_hashing_the_whole_rendered_prompt() -> None:
    idx = index()
    docs = [
        chat("s" * 40, "question one"),
        chat("s" * 40, "question two, a longer one than the first"),  # the head from the cache
        chat("s" * 40),
        chat("s" * 56, "q"),  # the head renders to 64 chars: whole blocks only
        chat("s" * 55, "qq" * 30),  # 63 chars: its last block runs into the next message
        chat("short", "a user turn that spans blocks " * 3),  # the head is under one block
        chat("h" * HEAD_CACHE_CHARS, "tail"),  # too long to cache: hashed as a whole
        {"prompt": "p" * 70},
        {"prompt": "p" * 70},
        chat("s" * 40 + "t" * 8, "q"),  # the same first block and length as the next one
        chat("s" * 40 + "u" * 8, "q"),
    ]
    for doc in docs * 2:
        text = prompt_text(doc)
        assert text is not None
        assert block_hashes(text, 16) == idx.hashes(doc)


def test_the_system_prompt_cache_is_bounded() -> None:
    idx = index()
    for n in range(HEAD_CACHE * 3):
        idx.hashes(chat(f"{n:06d} is this system prompt's number", "q"))

    assert len(idx._heads) == HEAD_CACHE
