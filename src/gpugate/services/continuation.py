"""Mid-stream rescue (issue #13): a chat stream that broke after bytes reached the client goes
on elsewhere, and the client sees one unbroken answer — or, when no target can continue it
faithfully, the terminal ``event: error`` as before. Never duplicated or garbled text.

Two ways to continue, chosen per target upstream (``continuation:`` in its config):

* ``prefill`` — the original messages plus a trailing assistant message holding the text
  delivered so far, with vLLM's ``continue_final_message: true, add_generation_prompt: false``:
  the target writes only what follows. Any model that accepts it may continue (the same
  model's other endpoint or a fallback model). A target that refuses it (a 4xx) is skipped; its
  refusal never reaches the client.
* ``replay`` — the same request again; the output is suppressed until it has passed, byte for
  byte, the text already delivered, then relayed. Valid only when the answer is reproducible:
  the *same model* and a deterministic request (``temperature: 0`` or a ``seed``). If the
  replay's text departs from what was delivered, the stream ends with the original error.

Only ``/v1/chat/completions`` streams with a single choice are continued (``n`` > 1, tool calls
and logprobs are not). The relay keeps the events it delivered (at most :data:`KEEP_LIMIT`
bytes; a longer answer is not continued) and reads them only when a stream breaks: the happy
path pays one list append per chunk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: The most of a stream's delivered events kept for a continuation.
KEEP_LIMIT = 1024 * 1024
#: How many times one stream may be continued.
MAX_CONTINUATIONS = 2
CHAT_PATH = "/v1/chat/completions"


@dataclass(slots=True)
class Delivered:
    """What the client got before the break: the answer's text so far, and its chunk id."""

    text: str
    chunk_id: str | None
    finished: bool  # a finish_reason was delivered: nothing to continue


def continuable(doc: dict[str, Any] | None, path: str) -> bool:
    """Whether a stream of this request could be continued at all (cheap: once per request)."""
    if doc is None or not path.startswith(CHAT_PATH):
        return False
    n = doc.get("n")
    return (n is None or n == 1) and not doc.get("tools") and not doc.get("logprobs")


def deterministic(doc: dict[str, Any]) -> bool:
    """Whether the same model answers this request the same way again: ``temperature`` 0 or
    a ``seed`` (an engine with batch-invariant kernels; see docs/dataplane.md)."""
    temperature = doc.get("temperature")
    seed = doc.get("seed")
    zero = isinstance(temperature, int | float) and not isinstance(temperature, bool)
    return (zero and temperature == 0) or (isinstance(seed, int) and not isinstance(seed, bool))


def _events(data: bytes) -> list[dict[str, Any]]:
    """The JSON data events of an SSE text (``[DONE]`` and anything unreadable left out)."""
    out = []
    for line in data.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            continue
        try:
            doc = json.loads(payload)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def _delta(event: dict[str, Any]) -> tuple[str, bool]:
    """An event's content delta and whether it carries a finish reason."""
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "", False
    choice = choices[0]
    delta = choice.get("delta")
    content = delta.get("content") if isinstance(delta, dict) else None
    return (content if isinstance(content, str) else ""), choice.get("finish_reason") is not None


def delivered(chunks: list[bytes]) -> Delivered:
    """Read what was delivered (only after a break)."""
    text: list[str] = []
    chunk_id = None
    finished = False
    for event in _events(b"".join(chunks)):
        chunk_id = chunk_id or event.get("id")
        content, done = _delta(event)
        text.append(content)
        finished = finished or done
    return Delivered("".join(text), chunk_id if isinstance(chunk_id, str) else None, finished)


def prefill_body(doc: dict[str, Any], model: str, text: str) -> bytes:
    """The request that continues ``text`` on ``model`` as an assistant prefill."""
    messages = [*doc.get("messages", []), {"role": "assistant", "content": text}]
    body = {
        **doc,
        "model": model,
        "messages": messages,
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    return json.dumps(body, separators=(",", ":")).encode()


class Diverged(Exception):
    """A replay's text departed from what was delivered: it cannot continue the stream."""


class Replay:
    """Filters a replayed stream: drops events until the delivered text has been passed (each
    byte checked), then lets the rest through. :meth:`feed` takes complete events."""

    __slots__ = ("_at", "_text", "passed")

    def __init__(self, text: str) -> None:
        self._text = text
        self._at = 0
        self.passed = not text

    def feed(self, chunk: bytes) -> bytes:
        """What of ``chunk`` (complete SSE events) the client should get."""
        if self.passed:
            return chunk
        out: list[bytes] = []
        for raw in chunk.split(b"\n\n"):
            if not raw.strip():
                continue
            if self.passed:
                out.append(raw + b"\n\n")
                continue
            out.append(self._one(raw))
        return b"".join(out)

    def _one(self, raw: bytes) -> bytes:
        events = _events(raw)
        if not events:  # [DONE] or a comment before the text was passed
            if b"[DONE]" in raw:
                raise Diverged("the replay ended before reaching the delivered text")
            return b""
        event = events[0]
        content, finished = _delta(event)
        left = len(self._text) - self._at
        if len(content) <= left:
            if self._text[self._at : self._at + len(content)] != content:
                raise Diverged("the replay's text departs from what was delivered")
            self._at += len(content)
            if finished and self._at < len(self._text):
                raise Diverged("the replay finished before reaching the delivered text")
            if self._at == len(self._text):
                self.passed = True
                return raw + b"\n\n" if finished else b""
            return b""
        if content[:left] != self._text[self._at :]:
            raise Diverged("the replay's text departs from what was delivered")
        self._at = len(self._text)
        self.passed = True
        event["choices"][0]["delta"]["content"] = content[left:]
        return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"
