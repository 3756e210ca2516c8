"""Job slugs, lease tokens and call ids from the pooled randomness (``core/tokens``)."""

from __future__ import annotations

import os
import re

from gpugate.core import job_transitions, tokens

URLSAFE = re.compile(r"[A-Za-z0-9_-]+")


def test_a_slug_is_job_and_20_url_safe_characters_and_never_repeats() -> None:
    slugs = {job_transitions.new_slug() for _ in range(5000)}  # > one 4 KiB block of the pool
    assert len(slugs) == 5000
    for slug in slugs:
        assert slug.startswith("job_")
        assert len(slug) == 24
        assert URLSAFE.fullmatch(slug[4:])


def test_lease_tokens_are_128_bits_each_and_distinct() -> None:
    drawn = job_transitions.new_lease_tokens(300) + job_transitions.new_lease_tokens(300)
    assert len(set(drawn)) == 600
    assert {len(token) for token in drawn} == {22}  # 16 bytes, url-safe base64, no padding


def test_a_token_larger_than_the_pool_block_is_whole() -> None:
    assert len(tokens.token_bytes(10_000)) == 10_000


def test_a_forked_child_draws_other_tokens_than_its_parent() -> None:
    tokens.token_bytes(1)  # the parent's pool holds bytes a child must not reuse
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next token, to the parent
        try:
            os.write(write, tokens.token_urlsafe(16).encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = tokens.token_urlsafe(16)
    assert child
    assert child != parent
