"""What every HTTP body model shares: strict request bodies, views of our records, the error
shape, and the text types of path, query and header parameters.

A request body (:class:`RequestBody`) is strict — ``"1"`` is not a number, ``1`` is not
``true`` — refuses unknown keys and non-finite numbers. A view (:class:`View`) is built from our
own records (``from_attributes``) and keeps out of the JSON what it was not given, so the
optional parts of a record stay absent rather than ``null``.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import TYPE_CHECKING, Annotated, Any, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    WithJsonSchema,
)

from gpugate.config.paths import describe, format_path
from gpugate.config.problems import key_path, message, model_at

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

MAX_KEY_LENGTH = 255
"""The longest id, slug, filter or key a client may send (PostgreSQL indexes refuse much more)."""

_CONTROL = frozenset(chr(c) for c in (*range(0x20), 0x7F))
PRINTABLE_PATTERN = "^[^\\u0000-\\u001f\\u007f]+$"


class RequestBody(BaseModel):
    """A JSON request body: strict, unknown keys refused, numbers finite."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class View(BaseModel):
    """A response body built from our own records; dumped without the fields it was not given."""

    model_config = ConfigDict(from_attributes=True, populate_by_name=True)

    def as_json(self) -> dict[str, Any]:
        """The body as JSON-ready data (what the response carries)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)

    def to_bytes(self) -> bytes:
        return self.model_dump_json(by_alias=True, exclude_unset=True).encode()

    @classmethod
    def of(cls, record: Any) -> Self:
        """The view of ``record``: a dataclass of ours, or a dict of its fields."""
        return cls.model_validate(record)


class Query(BaseModel):
    """Query (or path, or header) parameters: strings converted, unknown ones ignored."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, frozen=True)


def _printable(value: str) -> str:
    if any(char in _CONTROL for char in value):
        raise ValueError(
            "expected text without control characters (a NUL, tab or newline cannot be stored "
            f"or matched), got {describe(value)}"
        )
    return value


Key = Annotated[
    str,
    Field(
        min_length=1, max_length=MAX_KEY_LENGTH, json_schema_extra={"pattern": PRINTABLE_PATTERN}
    ),
    AfterValidator(_printable),
]
"""An id, slug, filter or key from a client: 1-255 characters, no control characters."""

Timestamp = Annotated[
    datetime,
    PlainSerializer(lambda moment: moment.isoformat(), return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time"}, mode="serialization"),
]
"""A moment, written as ISO-8601 with its UTC offset (``2025-01-01T00:00:00+00:00``)."""

#: Sums of float cents carry binary noise (0.0011950000000000016); an answer shows them to a
#: millionth of a cent, which is below any price a runtime reports.
CENTS_DIGITS = 6
Cents = Annotated[float, AfterValidator(lambda value: round(value, CENTS_DIGITS))]
Day = Annotated[
    date,
    PlainSerializer(lambda day: day.isoformat(), return_type=str),
    WithJsonSchema({"type": "string", "format": "date"}, mode="serialization"),
]
"""A UTC day, written ``2025-01-31``."""


class Problem(BaseModel):
    """One problem of a config document: its key path, what is wrong, its line (YAML)."""

    path: str
    message: str
    line: int | None


class ErrorDetail(BaseModel):
    """What went wrong: ``code`` is stable (clients branch on it), ``message`` is for people."""

    message: str
    type: str = Field(examples=["invalid_request_error", "server_error", "overloaded_error"])
    code: str = Field(examples=["BAD_REQUEST", "UNAUTHORIZED", "NO_HEALTHY_UPSTREAM"])
    problems: list[Problem] | None = Field(
        None, description="CONFIG_INVALID only: every problem of the document"
    )


class ErrorBody(BaseModel):
    """Every error, in OpenAI's shape."""

    error: ErrorDetail


_AWARE_EXAMPLE = "2025-01-01T00:00:00+00:00"
_SHORTEST = 60  # characters of an offending value a message repeats


def _what(error: ErrorDetails) -> str:
    """What was expected and what was found, repeating no more than a glimpse of the input."""
    value = error["input"]
    if error["type"] == "string_too_long":
        return f"expected at most {error['ctx']['max_length']} characters, got {len(value)}"
    if error["type"] == "string_too_short" and error["ctx"]["min_length"] > 1:
        return f"expected at least {error['ctx']['min_length']} characters, got {len(value)}"
    if isinstance(value, str) and len(value) > _SHORTEST:
        value = value[:_SHORTEST] + "..."
        error = {**error, "input": value}
    if error["type"] == "enum":
        return f"expected {error['ctx']['expected']}, got {describe(value)}"
    if error["type"] == "timezone_aware":
        return f"expected a time with its UTC offset ({_AWARE_EXAMPLE}), got {describe(value)}"
    return message(error)


def validation_message(exc: ValidationError, data: Any, model: type[BaseModel]) -> str:
    """Every problem of ``exc`` as ``key.path[0]: what was wrong``, joined by ``; ``."""
    parts = []
    for error in exc.errors():
        path = key_path(error["loc"], data)
        if error["type"] == "extra_forbidden":
            owner = model_at(model, path[:-1], data)
            names = [] if owner is None else [f.alias or n for n, f in owner.model_fields.items()]
            what = f"unknown key (allowed: {', '.join(names)})"
        else:
            what = _what(error)
        parts.append(f"{format_path(path) or '(body)'}: {what}")
    return "; ".join(parts)
