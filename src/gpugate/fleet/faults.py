"""The faults a fake model server can inject, and the log of what it saw.

A :class:`Fault` is one rule: a `kind` of misbehaviour, optionally limited to one `model`, to
streamed or non-streamed requests, to the next `count` matching requests ("500 once" is
``count=1``) or to `for_s` seconds after it was armed. Rules are armed on a running server with
``POST /_control/faults`` (or `ModelServer.inject`) and the first active rule that matches a
request applies to it. The kinds, each what a real provider does:

- ``status``: answer `status` (429, 500, 503, ...) with OpenAI's error body; for 429/503 a
  ``Retry-After`` of `retry_after_s` seconds, written as an HTTP date when `retry_after_date`.
- ``reset``: abort the connection (RST) before any byte of answer.
- ``silent``: accept the request and never answer (until the client goes away).
- ``slow_first_token``: a stream sends its headers at once, its first data event `seconds`
  later; a non-streamed answer comes `seconds` later.
- ``cut``: a stream is aborted (RST) after `after` content chunks; a non-streamed request is
  aborted before any byte (the server died while generating).
- ``stall``: a stream goes silent for `seconds` after `after` content chunks, then carries on;
  a non-streamed answer comes `seconds` later.
- ``malformed``: a stream carries an event that is not JSON after `after` content chunks (and
  carries on); a non-streamed answer is truncated JSON.
- ``no_done``: a stream ends with a clean close and no ``data: [DONE]`` — after `after` content
  chunks (no finish chunk either), or when `after` is null after the finish chunk.
- ``context_length``: 400 ``context_length_exceeded``, OpenAI's body.
- ``content_filter``: 400 content-policy refusal, OpenAI's (``content_policy_violation``) or
  Azure's (``content_filter``, with its ``innererror``) shape by `style`.
- ``reject_prefill``: 400 for a request whose last message is an assistant's (a prefill);
  requests without one do not match the rule.

A server that is down altogether (refusing connections) is `ModelServer.down_for`, not a rule.
"""

from __future__ import annotations

import collections
import dataclasses
import email.utils
import hashlib
import itertools
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from gpugate.fleet.control import Check, ControlError, boolean, integer, number, one_of, patched
from gpugate.fleet.replies import dumps

KINDS = (
    "status",
    "reset",
    "silent",
    "slow_first_token",
    "cut",
    "stall",
    "malformed",
    "no_done",
    "context_length",
    "content_filter",
    "reject_prefill",
)
STREAM_KINDS = frozenset({"slow_first_token", "cut", "stall", "malformed", "no_done"})
"""Kinds that act on the answer as it is written (the others answer instead of it)."""

_HOUR_S = 3600.0
_LOG_SIZE = 10_000
"""Requests kept in the log (the oldest go first): a long run cannot grow it without bound."""
MAX_RULES = 1_000

ContentStyle = Literal["openai", "azure"]


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault rule (see the module's docstring for the kinds)."""

    kind: str = "status"
    model: str | None = None
    stream: bool | None = None
    count: int | None = None
    for_s: float | None = None
    status: int = 500
    retry_after_s: float | None = None
    retry_after_date: bool = False
    after: int | None = None
    seconds: float = 0.0
    style: ContentStyle = "openai"

    @classmethod
    def from_json(cls, value: object) -> Fault:
        """A rule from its JSON form (ControlError naming the field if bad)."""
        if not isinstance(value, Mapping) or "kind" not in value:
            raise ControlError("a fault is a JSON object with a kind, one of " + ", ".join(KINDS))
        fault = patched(cls(), value, _CHECKS)
        if fault.kind in ("cut", "stall", "malformed") and fault.after is None:
            raise ControlError(f"{fault.kind}: after (the content chunks before it) is required")
        return fault

    def as_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def matches(self, model: str, *, stream: bool, prefill: bool) -> bool:
        return (
            (self.model is None or self.model == model)
            and (self.stream is None or self.stream == stream)
            and (self.kind != "reject_prefill" or prefill)
        )


def _text(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 256:
        raise ControlError(f"{name}: expected a model name (1-256 characters) or null")
    return value


_CHECKS: MappingProxyType[str, Check] = MappingProxyType(
    {
        "kind": one_of(*KINDS),
        "model": _text,
        "stream": lambda name, value: None if value is None else boolean()(name, value),
        "count": integer(1, 1_000_000, optional=True),
        "for_s": lambda name, value: None if value is None else number(0.0, _HOUR_S)(name, value),
        "status": integer(400, 599),
        "retry_after_s": lambda name, value: (
            None if value is None else number(0.0, _HOUR_S)(name, value)
        ),
        "retry_after_date": boolean(),
        "after": integer(0, 100_000, optional=True),
        "seconds": number(0.0, _HOUR_S),
        "style": one_of("openai", "azure"),
    }
)


@dataclass(slots=True)
class _Armed:
    ident: int
    fault: Fault
    remaining: int | None
    until: float | None

    def active(self, now: float) -> bool:
        return (self.remaining is None or self.remaining > 0) and (
            self.until is None or now < self.until
        )

    def as_json(self, now: float) -> dict[str, object]:
        left = None if self.until is None else max(0.0, round(self.until - now, 3))
        return {
            "id": self.ident,
            **self.fault.as_json(),
            "remaining": self.remaining,
            "expires_in_s": left,
            "active": self.active(now),
        }


class FaultBook:
    """The armed rules of one server; `take` picks (and spends) the rule for a request."""

    __slots__ = ("_armed", "_ids")

    def __init__(self, faults: Iterable[Fault] = ()) -> None:
        self._armed: list[_Armed] = []
        self._ids = itertools.count(1)
        for fault in faults:
            self.arm(fault)

    def arm(self, fault: Fault) -> int:
        """Arm `fault` now (its `for_s` counts from now); returns its id."""
        now = time.monotonic()
        self._armed = [armed for armed in self._armed if armed.active(now)]
        if len(self._armed) >= MAX_RULES:
            raise ControlError(f"at most {MAX_RULES} fault rules may be armed at once")
        until = None if fault.for_s is None else now + fault.for_s
        armed = _Armed(next(self._ids), fault, fault.count, until)
        self._armed.append(armed)
        return armed.ident

    def clear(self) -> None:
        self._armed = []

    def take(self, model: str, *, stream: bool, prefill: bool) -> Fault | None:
        """The first active rule matching this request, one of its `count` spent; or None."""
        now = time.monotonic()
        for armed in self._armed:
            if armed.active(now) and armed.fault.matches(model, stream=stream, prefill=prefill):
                if armed.remaining is not None:
                    armed.remaining -= 1
                return armed.fault
        return None

    def as_json(self) -> list[dict[str, object]]:
        now = time.monotonic()
        return [armed.as_json(now) for armed in self._armed]


def parse_rules(body: object) -> list[Fault]:
    """The rules of a ``POST /_control/faults`` body: one rule, or ``{"faults": [rule, ...]}``."""
    if isinstance(body, Mapping) and "faults" in body and "kind" not in body:
        rules = body["faults"]
        if not isinstance(rules, list) or len(body) != 1:
            raise ControlError('expected {"faults": [rule, ...]} or a single rule')
        return [Fault.from_json(rule) for rule in rules]
    return [Fault.from_json(body)]


# -- what a refusing fault answers ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refusal:
    """An error answer: status, JSON body and extra headers."""

    status: int
    body: bytes
    headers: Mapping[str, str]


_STATUS_ERRORS: Mapping[int, tuple[str, str | None, str | None]] = {
    429: (
        "Rate limit reached for requests. Please try again later.",
        "requests",
        "rate_limit_exceeded",
    ),
    500: (
        "The server had an error while processing your request. Sorry about that!",
        "server_error",
        None,
    ),
    502: ("Bad gateway.", "server_error", None),
    503: ("The server is overloaded or not ready yet.", "server_error", None),
    504: ("Gateway timeout.", "server_error", None),
}

_AZURE_FILTER = {
    "hate": {"filtered": False, "severity": "safe"},
    "jailbreak": {"filtered": False, "detected": False},
    "self_harm": {"filtered": False, "severity": "safe"},
    "sexual": {"filtered": False, "severity": "safe"},
    "violence": {"filtered": True, "severity": "medium"},
}
CONTEXT_LIMIT = 4096


def refusal(fault: Fault, *, server: str, prompt_tokens: int) -> Refusal | None:
    """The error answer of a refusing fault; None for the kinds that are not one."""
    if fault.kind == "status":
        return _status(fault, server)
    if fault.kind == "context_length":
        message = (
            f"This model's maximum context length is {CONTEXT_LIMIT} tokens. However, your"
            f" messages resulted in {CONTEXT_LIMIT + prompt_tokens} tokens. Please reduce the"
            " length of the messages."
        )
        error = {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
        return Refusal(400, dumps({"error": error}), {})
    if fault.kind == "content_filter":
        return Refusal(400, dumps({"error": _content_filter(fault.style)}), {})
    if fault.kind == "reject_prefill":
        error = {
            "message": (
                "This model does not support assistant message prefill: the final message"
                " must have role 'user' or 'tool'."
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "unsupported_prefill",
        }
        return Refusal(400, dumps({"error": error}), {})
    return None


def _status(fault: Fault, server: str) -> Refusal:
    message, kind, code = _STATUS_ERRORS.get(
        fault.status, (f"{server}: injected failure ({fault.status})", "server_error", "injected")
    )
    headers: dict[str, str] = {}
    if fault.retry_after_s is not None:
        if fault.retry_after_date:
            # an HTTP date has whole seconds: round up so the wait is never shorter than asked
            at = time.time() + fault.retry_after_s + 1.0
            headers["Retry-After"] = email.utils.formatdate(int(at), usegmt=True)
        else:
            headers["Retry-After"] = f"{fault.retry_after_s:g}"
    error = {"message": message, "type": kind, "param": None, "code": code}
    return Refusal(fault.status, dumps({"error": error}), headers)


def _content_filter(style: ContentStyle) -> dict[str, object]:
    if style == "azure":
        return {
            "message": (
                "The response was filtered due to the prompt triggering Azure OpenAI's content"
                " management policy. Please modify your prompt and retry. To learn more about"
                " our content filtering policies please read our documentation:"
                " https://go.microsoft.com/fwlink/?linkid=2198766"
            ),
            "type": None,
            "param": "prompt",
            "code": "content_filter",
            "status": 400,
            "innererror": {
                "code": "ResponsibleAIPolicyViolation",
                "content_filter_result": _AZURE_FILTER,
            },
        }
    return {
        "message": (
            "Your request was rejected as a result of our safety system. Your prompt may"
            " contain text that is not allowed by our safety system."
        ),
        "type": "invalid_request_error",
        "param": None,
        "code": "content_policy_violation",
    }


MALFORMED_EVENT = b'data: {"id": "chatcmpl-broken", "choices": [{"delta": {"content": "\n\n'
"""An event cut inside its JSON, as a broken proxy or a crashed writer leaves it."""


# -- what the server saw -------------------------------------------------------------------------


def fingerprint(model: str, messages: object) -> str:
    """The identity of "the same request" for attempt counting: the model and the messages,
    without a trailing assistant prefill."""
    if isinstance(messages, list) and messages and _is_prefill(messages[-1]):
        messages = messages[:-1]
    text = json.dumps([model, messages], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prefill_of(body: Mapping[str, Any]) -> str | None:
    """The text of a trailing assistant message (a prefill), or None."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages and _is_prefill(messages[-1]):
        content = messages[-1].get("content")
        return content if isinstance(content, str) else ""
    return None


def _is_prefill(message: object) -> bool:
    return isinstance(message, Mapping) and message.get("role") == "assistant"


class RequestLog:
    """The model requests a server saw, newest last, bounded (`_LOG_SIZE`).

    Each entry: ``seq``, ``at`` (``time.monotonic()``, comparable between processes of one
    machine), ``route``, ``model``, ``stream``, ``prompt`` (the last user message's text),
    ``messages``, ``prefill`` (a trailing assistant message's text or null), ``key`` (the
    ``Idempotency-Key``), ``attempt`` (how many times this server has seen this request: same
    model and messages, prefill aside), ``fault`` (the kind applied, or null) and ``status``
    (the status answered; null for a reset or a request never answered).
    """

    __slots__ = ("_attempts", "_entries", "_seq")

    def __init__(self) -> None:
        self._entries: collections.deque[dict[str, Any]] = collections.deque(maxlen=_LOG_SIZE)
        self._attempts: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._seq = itertools.count(1)

    def record(
        self, route: str, body: Mapping[str, Any], prompt: str, key: str | None
    ) -> dict[str, Any]:
        model = str(body.get("model"))
        messages = body.get("messages")
        print_ = fingerprint(model, messages if messages is not None else body.get("prompt"))
        attempt = self._attempts.pop(print_, 0) + 1
        self._attempts[print_] = attempt
        while len(self._attempts) > _LOG_SIZE:
            self._attempts.popitem(last=False)
        entry: dict[str, Any] = {
            "seq": next(self._seq),
            "at": time.monotonic(),
            "route": route,
            "model": model,
            "stream": body.get("stream") is True,
            "prompt": prompt,
            "messages": messages,
            "prefill": prefill_of(body),
            "key": key,
            "attempt": attempt,
            "fault": None,
            "status": None,
        }
        self._entries.append(entry)
        return entry

    def entries(self, *, since: int = 0) -> list[dict[str, Any]]:
        return [dict(entry) for entry in self._entries if entry["seq"] > since]

    def of(self, prompt: str) -> list[dict[str, Any]]:
        """The requests whose last user message was `prompt`, oldest first."""
        return [dict(entry) for entry in self._entries if entry["prompt"] == prompt]


def gaps(entries: Sequence[Mapping[str, Any]]) -> list[float]:
    """Seconds between consecutive arrivals of `entries` (a test's "no hammering" check)."""
    times = [float(entry["at"]) for entry in entries]
    return [later - earlier for earlier, later in itertools.pairwise(times)]
