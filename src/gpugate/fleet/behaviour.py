"""How a fake model server misbehaves: the knobs tests turn through ``POST /_control``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType

from gpugate.fleet.control import Check, boolean, integer, number, patched

_HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class ServerBehaviour:
    """The behaviour of one fake model server; the defaults answer at once and correctly.

    - `delay_s`: wait this long before answering a model request.
    - `chunk_delay_s`: wait this long before each content chunk (and before the final chunk) of
      a stream.
    - `chunks`: how many content chunks an answer is cut into (streamed or not).
    - `fail_status`: answer model requests with this HTTP status and an OpenAI-shaped error.
    - `hang`: hold model requests without answering until the client goes away, the server
      stops, or `hang` is turned off again (held requests then carry on).
    - `reset_after_chunks`: abort the TCP connection (RST, no clean end) after this many content
      chunks of a stream.
    - `drop_connection`: abort the TCP connection of model requests before any byte of answer.
    - `health_status`: the status of ``GET /health``.
    - `max_running`: requests in flight beyond this count as waiting in the vLLM gauges.
    - `answer_tokens`: answer chats with this many deterministic tokens of the model (one per
      content chunk, `chunks` aside; `replies.token_text`), the same on every server serving the
      model, so a replay elsewhere can be checked byte for byte. None: the echo answer.

    Faults beyond these (429 with ``Retry-After``, a cut or stalled stream, content-policy
    refusals, ...) are rules armed with ``POST /_control/faults`` (:mod:`gpugate.fleet.faults`).
    """

    delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    chunks: int = 8
    fail_status: int | None = None
    hang: bool = False
    reset_after_chunks: int | None = None
    drop_connection: bool = False
    health_status: int = 200
    max_running: int = 256
    answer_tokens: int | None = None

    def patched(self, patch: object) -> ServerBehaviour:
        """This behaviour with the fields of a JSON control body replaced (ControlError if bad)."""
        return patched(self, patch, _CHECKS)

    def as_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


_CHECKS: MappingProxyType[str, Check] = MappingProxyType(
    {
        "delay_s": number(0.0, _HOUR_S),
        "chunk_delay_s": number(0.0, _HOUR_S),
        "chunks": integer(1, 100_000),
        "fail_status": integer(400, 599, optional=True),
        "hang": boolean(),
        "reset_after_chunks": integer(0, 100_000, optional=True),
        "drop_connection": boolean(),
        "health_status": integer(100, 599),
        "max_running": integer(0, 1_000_000),
        "answer_tokens": integer(0, 100_000, optional=True),
    }
)
