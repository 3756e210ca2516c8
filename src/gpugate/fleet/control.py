"""Validation of the JSON control patches that steer the fakes at runtime.

A control request is a JSON object naming some fields of a frozen dataclass; every field has a
check that turns the raw JSON value into the field's value or raises :class:`ControlError`. The
result is a new dataclass with those fields replaced (a partial update).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Check = Callable[[str, Any], Any]
"""Turns the raw JSON value of the named field into its typed value, or raises ControlError."""

_T = TypeVar("_T", bound="DataclassInstance")


class ControlError(ValueError):
    """The control request cannot be applied (unknown field, wrong type or out of range)."""


def patched(current: _T, patch: object, checks: Mapping[str, Check]) -> _T:
    """`current` with the fields named in `patch` replaced, each validated by its check."""
    if not isinstance(patch, Mapping):
        raise ControlError("a control body must be a JSON object")
    unknown = sorted(str(name) for name in patch if name not in checks)
    if unknown:
        raise ControlError(f"unknown field(s) {unknown}; known fields: {sorted(checks)}")
    changes = {name: checks[name](name, value) for name, value in patch.items()}
    return dataclasses.replace(current, **changes)


def integer(low: int, high: int, *, optional: bool = False) -> Check:
    """An integer in [low, high]; with `optional`, JSON null too."""

    def check(name: str, value: Any) -> int | None:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            nullable = " or null" if optional else ""
            raise ControlError(f"{name}: expected an integer in [{low}, {high}]{nullable}")
        return value

    return check


def number(low: float, high: float) -> Check:
    """A number (integer or float) in [low, high], as a float."""

    def check(name: str, value: Any) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high
        ):
            raise ControlError(f"{name}: expected a number in [{low}, {high}]")
        return float(value)

    return check


def boolean() -> Check:
    """JSON true or false."""

    def check(name: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ControlError(f"{name}: expected true or false")
        return value

    return check


def one_of(*choices: object) -> Check:
    """One of the given JSON values."""

    def check(name: str, value: Any) -> Any:
        if isinstance(value, bool) or value not in choices:
            raise ControlError(f"{name}: expected one of {list(choices)}")
        return value

    return check
