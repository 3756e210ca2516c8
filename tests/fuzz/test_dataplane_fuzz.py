"""The data plane, fuzzed below the OpenAPI document: random methods, paths (dot segments, ``%00``,
encoded slashes, ``?`` and ``#``), header names and values and bodies, written as raw HTTP/1.1
bytes on a socket. Every request gets an answer within the hang limit, never a 500, and never a
5xx the gateway's own fault (issue 14 defect 13, issue 15 Done-when 2). The run's size is printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from fuzz_rig import FUZZ, HANG_S, fuzz_gateway
from hypothesis import given, seed, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("GPUGATE_FUZZ_DATAPLANE_EXAMPLES", "400"))
SEED = int(os.environ.get("GPUGATE_FUZZ_SEED", "20261201"))
# 5xx a client may see through no fault of the gateway: the fake upstream's own, or refusals
OWN_FAULTS = frozenset({"INTERNAL", "STORE_ERROR", ""})
ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models"]
HEADERS = [
    "X-Request-Class",
    "Idempotency-Key",
    "X-Request-Id",
    "Content-Type",
    "Authorization",
    "api-key",
    "Accept",
    "Expect",
    "Connection",
    "Cookie",
    "X-Forwarded-For",
]
TOKEN = st.text(alphabet="!#$%&'*+-.^_`|~" + "abcdefghijklmnopqrstuvwxyzABC0123456789", min_size=1)
VALUE = st.binary(max_size=300).map(lambda raw: bytes(b for b in raw if b >= 0x20 or b == 0x09))
PATH_PIECE = st.sampled_from(
    ["..", ".", "%2e%2e", "%2F", "%2f..%2f", "%00", "%3F", "%23", "?", "#", "%ff", "%C3%A9", "//"]
)


@dataclass
class Outcome:
    requests: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)


@st.composite
def paths(draw: st.DrawFn) -> bytes:
    query = draw(st.sampled_from(["", "", "", "?a=b", "?stream=true&x=%00", "?" + "q" * 3000]))
    if draw(st.booleans()):
        return (draw(st.sampled_from(ROUTES)) + query).encode()
    upstream = draw(st.sampled_from(["u", "u", "u", "nope", "", "%00", ".."]) | TOKEN)
    tail = draw(st.lists(PATH_PIECE | TOKEN, max_size=6))
    return (f"/u/{upstream}/" + "/".join(tail) + query).encode("latin-1")


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    choice = draw(st.integers(0, 7))
    if choice <= 3:
        doc = {"model": draw(st.sampled_from(["m", "nope", ""])), "stream": draw(st.booleans())}
        doc["messages"] = [{"role": "user", "content": draw(st.text(max_size=50))}]
        return json.dumps(doc).encode()
    if choice == 1:
        return b"[" * 5000 + b"]" * 5000
    if choice == 2:
        return b'{"model": "m", "x": NaN, "s": "\\u0000\\ud800"}'
    if choice == 3:
        return draw(st.binary(max_size=500))
    return b""


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(["POST", "POST", "POST", "GET", "PUT", "DELETE", "OPTIONS"]))
    body = draw(bodies())
    lines = [method.encode() + b" " + draw(paths()) + b" HTTP/1.1", b"Host: 127.0.0.1"]
    for _ in range(draw(st.integers(0, 6))):
        name = draw(st.sampled_from(HEADERS) | TOKEN).encode()
        value = draw(VALUE | st.sampled_from([b"batch", b"system", b"", b"k" * 3000]))
        lines.append(name + b": " + value.strip(b" \t"))
    length = (
        str(len(body)).encode()
        if draw(st.integers(0, 9))
        else draw(st.sampled_from([b"abc", b"-1"]))
    )
    lines += [b"Content-Length: " + length, b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def exchange(port: int, raw: bytes) -> bytes:
    """Send ``raw``, read until the server closes (bounded by HANG_S); the bytes read."""
    deadline = time.monotonic() + HANG_S
    received = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_S) as conn:
        conn.sendall(raw)
        while (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            try:
                chunk = conn.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                return bytes(received)
            received += chunk
    raise TimeoutError


def verdict(answer: bytes) -> tuple[int, str | None]:
    """The status, and what is wrong with the answer (None: nothing)."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split(b" ")
    if len(status_line) < 2 or not status_line[1].isdigit():
        return 0, f"no status line in {answer[:120]!r}"
    status = int(status_line[1])
    if status < 500:
        return status, None
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = ""
    if status == 500 or code in OWN_FAULTS:
        return status, f"{status} {code or body[:120]!r}"
    return status, None


def run(port: int) -> Outcome:
    outcome = Outcome()

    @seed(SEED)
    @given(raw=requests())
    @settings(FUZZ, max_examples=EXAMPLES)
    def send(raw: bytes) -> None:
        outcome.requests += 1
        try:
            answer = exchange(port, raw)
        except TimeoutError:
            outcome.findings.append(f"no answer within {HANG_S:g} s: {raw[:300]!r}")
            return
        status, problem = verdict(answer)
        outcome.statuses[status] = outcome.statuses.get(status, 0) + 1
        if problem is not None:
            outcome.findings.append(f"{problem}: {raw[:300]!r}")

    send()
    return outcome


def counted(statuses: dict[int, int]) -> Iterator[str]:
    for status, count in sorted(statuses.items()):
        yield f"{status}x{count}"


@pytest.mark.timeout(240)
async def test_fuzzed_data_plane_requests_are_answered_in_time_and_never_with_a_500(
    fuzz_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with fuzz_gateway(fuzz_dsn) as (gw, _):
        port = int(gw.url.rsplit(":", 1)[1])
        started = time.monotonic()
        outcome = await asyncio.to_thread(run, port)
        elapsed = time.monotonic() - started
    with capsys.disabled():
        print(
            f"\ndata-plane fuzz: {outcome.requests} raw requests in {elapsed:.1f} s "
            f"(seed {SEED}): {' '.join(counted(outcome.statuses))}"
        )

    assert [] == outcome.findings
    assert outcome.requests >= EXAMPLES // 2
