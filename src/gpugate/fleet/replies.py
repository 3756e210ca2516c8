"""The OpenAI wire shapes a fake model server answers with, built from a request body.

Everything here is pure: a request body goes in, bytes come out. The answer text is
deterministic, names the server and echoes the prompt (``"qwen-35b answers: hello"``), so a test
can tell which server answered and the joined stream equals the non-streamed content.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any, Literal

_ECHO_WORDS = 32
_DONE = b"data: [DONE]\n\n"


class InvalidRequestError(ValueError):
    """The request body is not a valid OpenAI request of its route."""


def dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def error_body(message: str, kind: str, code: str | None = None) -> bytes:
    """An error in OpenAI's shape."""
    return dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


def answer_text(server: str, prompt: str) -> str:
    echo = " ".join(prompt.split()[:_ECHO_WORDS])
    return f"{server} answers: {echo}" if echo else f"{server} answers."


_WORDS = (
    "amber",
    "basin",
    "cedar",
    "delta",
    "ember",
    "fjord",
    "grove",
    "harbor",
    "inlet",
    "jasper",
    "kelp",
    "lagoon",
    "meadow",
    "nectar",
    "orchid",
    "pebble",
    "quartz",
    "ridge",
    "spruce",
    "tundra",
    "umber",
    "valley",
    "willow",
    "xenon",
    "yarrow",
    "zephyr",
    "atlas",
    "breeze",
    "canyon",
    "dune",
    "estuary",
    "fern",
    "glacier",
    "heath",
    "island",
    "juniper",
    "knoll",
    "lichen",
    "marsh",
    "nimbus",
    "oasis",
    "prairie",
    "quarry",
    "reef",
    "summit",
    "thicket",
    "upland",
    "vapor",
    "wharf",
    "yonder",
    "azure",
    "birch",
    "coral",
    "dawn",
    "echo",
    "flint",
    "granite",
    "hollow",
    "ivy",
    "jade",
    "kestrel",
    "lumen",
    "moss",
    "north",
)


def token_pieces(model: str, prompt: str, count: int) -> tuple[str, ...]:
    """`count` tokens of a deterministic answer of `model` to `prompt`: the same on every server
    serving `model` (so a replay can be checked byte for byte), different between models.
    Tokens are words, the first bare and each later one after a space."""
    pieces: list[str] = []
    for i in range(count):
        digest = hashlib.blake2b(f"{model}\0{prompt}\0{i}".encode(), digest_size=2).digest()
        word = _WORDS[int.from_bytes(digest, "big") % len(_WORDS)]
        pieces.append(word if i == 0 else " " + word)
    return tuple(pieces)


def token_text(model: str, prompt: str, count: int) -> str:
    """The whole deterministic answer of `token_pieces`."""
    return "".join(token_pieces(model, prompt, count))


def continued(pieces: tuple[str, ...], prefill: str | None) -> tuple[str, ...]:
    """What a model whose answer is `pieces` writes after an assistant `prefill`.

    A model continues its own answer from where the prefill leaves off: after as many tokens as
    the prefill has words (the prefill's own words stay the client's; a model whose answer does
    not begin with them still goes on from that position, as a model given another's text does).
    """
    if prefill is None:
        return pieces
    return pieces[len(prefill.split()) :]


def cut(text: str, pieces: int) -> tuple[str, ...]:
    """`text` in `pieces` contiguous non-empty slices (padded with spaces when too short)."""
    text = text.ljust(pieces)
    size = len(text)
    return tuple(text[i * size // pieces : (i + 1) * size // pieces] for i in range(pieces))


def tokens(text: str) -> int:
    return len(text.split())


@dataclass(frozen=True, slots=True)
class Stream:
    """The SSE events of a streamed answer: `steps` are the content chunks, with delays between."""

    head: tuple[bytes, ...]
    steps: tuple[bytes, ...]
    tail: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Completion:
    """One chat or text completion: its id, model, and each choice's content cut into chunks.

    Every choice has the same number of chunks; a stream interleaves them chunk by chunk.
    """

    kind: Literal["chat", "text"]
    id: str
    created: int
    model: str
    pieces: tuple[tuple[str, ...], ...]
    prompt_tokens: int

    @property
    def completion_tokens(self) -> int:
        return sum(len(choice) for choice in self.pieces)

    def usage(self) -> dict[str, int]:
        done = self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": done,
            "total_tokens": self.prompt_tokens + done,
        }

    def body(self) -> bytes:
        """The non-streamed JSON answer."""
        choices: list[dict[str, Any]] = []
        for index, pieces in enumerate(self.pieces):
            content = "".join(pieces)
            if self.kind == "chat":
                message = {"role": "assistant", "content": content}
                choices.append({"index": index, "message": message, **_STOPPED})
            else:
                choices.append({"index": index, "text": content, **_STOPPED})
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        return dumps({**self._envelope(obj), "choices": choices, "usage": self.usage()})

    def stream(self, *, include_usage: bool) -> Stream:
        """The SSE events: role chunk (chat), content chunks, finish chunk, usage chunk, DONE."""
        chunk = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        envelope = self._envelope(chunk)
        if include_usage:
            envelope["usage"] = None
        head: tuple[bytes, ...] = ()
        if self.kind == "chat":
            head = tuple(
                _event(envelope, self._delta(i, {"role": "assistant", "content": ""}, None))
                for i in range(len(self.pieces))
            )
        steps = tuple(
            _event(envelope, self._delta(i, self._content(pieces[k]), None))
            for k in range(len(self.pieces[0]))
            for i, pieces in enumerate(self.pieces)
        )
        finish = [
            _event(
                envelope, self._delta(i, self._content("") if self.kind == "text" else {}, "stop")
            )
            for i in range(len(self.pieces))
        ]
        if include_usage:
            finish.append(_event({**envelope, "usage": self.usage()}, None))
        return Stream(head=head, steps=steps, tail=(*finish, _DONE))

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _content(self, piece: str) -> dict[str, str]:
        return {"content": piece} if self.kind == "chat" else {"text": piece}

    def _delta(self, index: int, content: dict[str, str], finish: str | None) -> dict[str, Any]:
        if self.kind == "chat":
            return {"index": index, "delta": content, "logprobs": None, "finish_reason": finish}
        return {"index": index, **content, "logprobs": None, "finish_reason": finish}


_STOPPED: dict[str, Any] = {"logprobs": None, "finish_reason": "stop"}


def _event(envelope: dict[str, Any], choice: dict[str, Any] | None) -> bytes:
    choices = [] if choice is None else [choice]
    return b"data: " + dumps({**envelope, "choices": choices}) + b"\n\n"


def chat_prompt(body: dict[str, Any]) -> tuple[str, int]:
    """The text of the last user message, and the word count of all messages."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages: expected a non-empty list of messages")
    texts: list[str] = []
    last_user = ""
    for message in messages:
        if not isinstance(message, dict):
            raise InvalidRequestError("messages: each message must be an object")
        text = _message_text(message.get("content"))
        texts.append(text)
        if message.get("role") == "user":
            last_user = text
    return last_user, sum(tokens(text) for text in texts)


def prompt_of(body: dict[str, Any]) -> str:
    """The text a model request is about, for the request log: the last user message of a chat,
    the (first) prompt of a completion, the (first) input of an embedding; "" if none."""
    try:
        if "messages" in body:
            return chat_prompt(body)[0]
        field = "prompt" if "prompt" in body else "input"
        return _texts(body.get(field), field)[0]
    except InvalidRequestError:
        return ""


def _message_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def completion_prompts(body: dict[str, Any]) -> list[str]:
    """The prompts of a text completion request (a string, strings, or token lists)."""
    return _texts(body.get("prompt"), "prompt")


def embedding_inputs(body: dict[str, Any]) -> list[str]:
    """The inputs of an embeddings request (a string, strings, or token lists)."""
    return _texts(body.get("input"), "input")


def _texts(value: object, field: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(item, int) for item in value):
            return [" ".join(str(item) for item in value)]
        if all(isinstance(item, str) for item in value):
            return [str(item) for item in value]
        if all(isinstance(item, list) for item in value):
            return [" ".join(str(token) for token in item) for item in value]
    raise InvalidRequestError(f"{field}: expected a string, a list of strings or of token lists")


def embedding(text: str, dimension: int) -> list[float]:
    """A deterministic vector in [-1, 1]^dimension for `text`."""
    digest = hashlib.shake_256(text.encode()).digest(2 * dimension)
    return [
        round(int.from_bytes(digest[2 * i : 2 * i + 2], "big") / 32767.5 - 1.0, 6)
        for i in range(dimension)
    ]


def embeddings_body(model: str, inputs: list[str], dimension: int, *, as_base64: bool) -> bytes:
    """The embeddings answer; base64 is little-endian float32, as OpenAI's client expects."""
    data: list[dict[str, Any]] = []
    for index, text in enumerate(inputs):
        vector = embedding(text, dimension)
        value: object = vector
        if as_base64:
            value = base64.b64encode(struct.pack(f"<{dimension}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": value})
    used = sum(tokens(text) for text in inputs)
    usage = {"prompt_tokens": used, "total_tokens": used}
    return dumps({"object": "list", "data": data, "model": model, "usage": usage})


def models_body(models: tuple[str, ...], created: int, owner: str) -> bytes:
    data = [{"id": m, "object": "model", "created": created, "owned_by": owner} for m in models]
    return dumps({"object": "list", "data": data})
