"""The relay's check of a stream's events (``dataplane._well_formed``) answers as its spec does.

The check runs on every chunk of every relayed stream, so it is one compiled search; the
per-line loop below is what it must answer, line for line: each ``data:`` line (split on LF,
its data stripped as ``bytes.strip`` strips) is ``[DONE]`` or a JSON object's ends that do not
open an error. A cut-off or error event fails it (the relay then ends the stream its own way).
"""

from __future__ import annotations

import random

import pytest

from gpugate.web.dataplane import _well_formed


def spec(chunk: bytes) -> bool:
    for line in chunk.split(b"\n"):
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data == b"[DONE]":
                continue
            if data[:1] != b"{" or data[-1:] != b"}" or data.startswith(b'{"error"'):
                return False
    return True


@pytest.mark.parametrize(
    ("chunk", "expected"),
    [
        (b'data: {"a":1}\n\ndata: [DONE]\n\n', True),
        (b'data:{"a":1}\r\n\r\ndata:  [DONE] \r\n', True),
        (b'event: x\ndata: {"a":1} \t\n: comment\n\n', True),
        (b'data: {"a":1', False),  # cut off
        (b'data: {"error": {"message": "boom"}}\n\n', False),
        (b"data: [DONE] x\n\n", False),
        (b"data: {\n\n", False),
        (b"data:\n\n", False),
        (b'id: 1\n{"not": "a data line"}\n\n', True),
        (b"", True),
    ],
)
def test_the_check_answers_as_its_spec(chunk: bytes, expected: bool) -> None:
    assert spec(chunk) is expected
    assert _well_formed(chunk) is expected


def test_random_chunks_of_stream_pieces_answer_as_the_spec() -> None:
    pieces = [
        b"data:", b" ", b"\t", b"\r", b"\n", b"{", b"}", b'"error"', b"[DONE]", b"x", b"\x0b",
        b"\x0c", b'data: {"a":1}', b"\n\n", b":", b"event: e\n", b"\x85", b"\xa0", b'{"error"',
        b"data: [DONE]", b"\ndata:", b'{"error":1}',
    ]  # fmt: skip
    rng = random.Random(20261201)
    for _ in range(50_000):
        chunk = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        assert _well_formed(chunk) is spec(chunk), chunk
