"""Request classes: who goes first when an upstream is busy.

``system`` outranks ``interactive`` outranks ``batch``. A sync request names its class in the
``X-Request-Class`` header (default ``interactive``); a job carries one (default ``batch``).
"""

from __future__ import annotations

from enum import StrEnum

from gpugate.errors import BadRequest

HEADER = "X-Request-Class"


class RequestClass(StrEnum):
    """The class of a request; its value is what clients send."""

    SYSTEM = "system"
    INTERACTIVE = "interactive"
    BATCH = "batch"

    @property
    def priority(self) -> int:
        """Higher goes first: system 2, interactive 1, batch 0."""
        match self:
            case RequestClass.SYSTEM:
                return 2
            case RequestClass.INTERACTIVE:
                return 1
            case RequestClass.BATCH:
                return 0


def by_priority() -> list[RequestClass]:
    """Every class, highest priority first."""
    return sorted(RequestClass, key=lambda cls: cls.priority, reverse=True)


def parse_request_class(value: str | None, *, default: RequestClass) -> RequestClass:
    """The class named by a header value (case-insensitive); ``default`` when absent or empty.

    Raises :class:`~gpugate.errors.BadRequest` naming the valid values for anything else.
    """
    if value is None or not value.strip():
        return default
    try:
        return RequestClass(value.strip().lower())
    except ValueError as exc:
        valid = ", ".join(by_priority())
        raise BadRequest(f"{HEADER} must be one of {valid}; got {value!r}") from exc
