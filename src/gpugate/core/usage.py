"""Reading a response's token usage, and hiding the usage the gateway asked for.

A JSON response carries ``usage`` at its top level. A stream carries it in a last chunk only
when the request said ``stream_options: {include_usage: true}``; the gateway adds that option
when a client did not ask (:func:`with_include_usage`), and :class:`StreamUsage` then takes the
extra chunk out again (the usage-only event, and the ``"usage":null`` that every other chunk
then carries), so the client receives the bytes it would have got without the option.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_NULL_USAGE = re.compile(rb',\s*"usage"\s*:\s*null|"usage"\s*:\s*null\s*,')
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
_OPTION = b',"stream_options":{"include_usage":true}'
_OPTION_END = _OPTION + b"}"
_MAX_EVENT = 1 << 20  # a single SSE event larger than this is passed on unread
#: The usage object as OpenAI-compatible servers write it, both counts whole numbers each ended
#: by a comma or the object's end: what a JSON parse of it says, read by one regex match
_PLAIN_USAGE = re.compile(
    rb'"usage"\s*:\s*\{\s*"prompt_tokens"\s*:\s*(\d{1,15})\s*,'
    rb'\s*"completion_tokens"\s*:\s*(\d{1,15})\s*[,}]'
)


@dataclass(slots=True)  # not frozen: one per keyed response, and frozen costs a setattr per field
class Usage:
    prompt_tokens: int
    completion_tokens: int


def usage_of(doc: Any) -> Usage | None:
    """The ``usage`` of a parsed response or chunk, or None."""
    if not isinstance(doc, dict):
        return None
    return _counts(doc.get("usage"))


def _counts(usage: Any) -> Usage | None:
    """A parsed ``usage`` object's counts, or None."""
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens", 0)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return Usage(prompt, completion)


#: The scanner ``JSONDecoder.raw_decode`` calls: (text, index) -> (value, end); untyped in typeshed
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def json_usage(body: bytes) -> Usage | None:
    """The usage of a whole JSON response body: its last ``"usage":`` object read on its own
    (OpenAI-compatible servers put it at the end), else the whole body parsed."""
    at = body.rfind(b'"usage"')
    if at < 0:
        return None
    plain = _PLAIN_USAGE.match(body, at)  # the common layout: no decode, no parse
    if plain is not None:
        return Usage(int(plain[1]), int(plain[2]))
    start = body.find(b"{", at)
    colon = body.find(b":", at)
    if 0 <= colon < start and not body[colon + 1 : start].strip():
        try:
            usage, _ = _SCAN(body[start:].decode(), 0)  # raw_decode's scanner, called directly
            found = _counts(usage)
        except (ValueError, StopIteration):  # bad JSON or UTF-8 (a ValueError), or no value
            found = None
        if found is not None:
            return found
    try:
        return usage_of(json.loads(body))
    except ValueError:
        return None


def with_include_usage(doc: dict[str, Any], body: bytes | None = None) -> bytes | None:
    """The request body with ``stream_options.include_usage`` set (the rest kept), or None
    when ``doc`` asks for usage already (the option is ``true``). The option is set in ``doc``
    too, so that ``doc`` stays what the bytes parse to (a new key goes last, as written; a
    parse of them is not needed): ``body`` (``doc``'s own bytes) with the option written in
    before its closing brace when it has no ``stream_options`` yet, else ``doc`` serialized
    again."""
    options = doc.get("stream_options")
    fresh = options is None and "stream_options" not in doc
    if fresh and doc and body is not None and body[-1:] == b"}":  # the common body: option last
        doc["stream_options"] = {"include_usage": True}
        return body[:-1] + _OPTION_END
    if isinstance(options, dict):
        if options.get("include_usage") is True:
            return None
        doc["stream_options"] = {**options, "include_usage": True}
        return json.dumps(doc, separators=(",", ":")).encode()
    doc["stream_options"] = {"include_usage": True}
    if body is not None and fresh and len(doc) > 1:  # not ``{}``: no comma before the option
        end = body.rfind(b"}")  # a JSON object's last brace is its own: only spaces follow
        if end > 0:
            return body[:end] + _OPTION + body[end:]
    return json.dumps(doc, separators=(",", ":")).encode()


class StreamUsage:
    """Watches an SSE stream go by: finds its usage and, when ``hide`` (the gateway asked for
    it, not the client), removes what asking added. Feed it the body chunks in order; it
    returns the bytes to send on (whole events; a partial one waits for its end)."""

    __slots__ = ("_buffer", "hide", "usage")

    def __init__(self, *, hide: bool) -> None:
        self.hide = hide
        self.usage: Usage | None = None
        self._buffer = b""

    def passes(self, chunk: bytes) -> bool:
        """Whether :meth:`feed` would hand ``chunk`` on as it is with nothing to read in it
        (whole events without usage, or usage found already and nothing to hide)."""
        if not self.hide and self.usage is not None:
            return True
        return not self._buffer and chunk.endswith(b"\n\n") and b'"usage"' not in chunk

    def hidden(self, chunk: bytes, *, more: bool) -> bytes:
        """A piece of the stream as the client gets it (``more=False``: the last, with what was
        left of an unterminated event): whole events without usage (the data plane relays
        whole events) as they are, anything else through :meth:`feed`."""
        if self._buffer or not chunk.endswith(b"\n\n") or b'"usage"' in chunk:
            chunk = self.feed(chunk)
            if not more:
                chunk += self.flush()
        return chunk

    def feed(self, chunk: bytes) -> bytes:
        if not self.hide and self.usage is not None:
            return chunk
        if not self._buffer and chunk.endswith(b"\n\n"):  # whole events, as relayed: not copied
            return self._events(chunk)
        data = self._buffer + chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            if len(data) > _MAX_EVENT:
                self._buffer = b""
                return data
            self._buffer = data
            return b""
        ready, self._buffer = data[: end + 2], data[end + 2 :]
        return self._events(ready)

    def _events(self, ready: bytes) -> bytes:
        """Whole events: the usage read, and what asking added taken out."""
        if b'"usage"' not in ready:  # the common case: nothing to read or take out, passed on
            return ready
        nulls = ready.count(b'"usage"') == ready.count(b'"usage":null')  # nothing to read
        if not self.hide:
            if not nulls:  # an event with usage in it (the last, as servers send it): parsed
                self._scan(ready)
            return ready
        if nulls:  # only the compact nulls asking added, as servers write them: cut out
            out = ready.replace(b'"usage":null,', b"").replace(b',"usage":null', b"")
            return out if b'"usage"' not in out else _NULL_USAGE.sub(b"", out)
        if _USAGE_OBJECT.search(ready) is None:  # only nulls, some spaced: one regex pass
            return _NULL_USAGE.sub(b"", ready)
        return b"".join(self._keep(event) for event in ready.split(b"\n\n")[:-1])

    def flush(self) -> bytes:
        """What is left at the end of the stream (an unterminated last event)."""
        rest, self._buffer = self._buffer, b""
        return rest

    def _scan(self, ready: bytes) -> None:
        for event in ready.split(b"\n\n"):
            self._usage_in(event)

    def _usage_in(self, event: bytes) -> dict[str, Any] | None:
        if b'"usage"' not in event:
            return None
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                try:
                    doc = json.loads(line[5:])
                except ValueError:
                    return None
                found = usage_of(doc)
                if found is not None:
                    self.usage = found
                    return doc if isinstance(doc, dict) else None
        return None

    def _keep(self, event: bytes) -> bytes:
        doc = self._usage_in(event)
        if doc is not None and doc.get("choices") == []:
            return b""  # the usage-only chunk the client did not ask for
        return _NULL_USAGE.sub(b"", event) + b"\n\n"
