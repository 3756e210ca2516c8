"""Key paths into a configuration document, and findings located by them.

A key path is a tuple of mapping keys (``str``) and sequence indexes (``int``):
``("upstreams", 1, "max_inflight")`` is written ``upstreams[1].max_inflight``. Mapping keys are
always strings here, even where YAML read them as numbers (``xid_overrides: {79: fatal}``), so
that the paths of the YAML line map and of the validation errors compare equal.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

KeyPath: TypeAlias = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem found in a document: where (a key path) and what; the line comes later.

    ``line`` overrides the line the source map would give the path (a duplicate YAML key knows
    its own line better than the map, which keeps the last occurrence).
    """

    path: KeyPath
    message: str
    line: int | None = None


def format_path(path: KeyPath) -> str:
    """``("upstreams", 1, "max_inflight")`` → ``upstreams[1].max_inflight``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def describe(value: Any) -> str:
    """A value as a message shows it after "got": ``'lots'``, ``1.5``, ``null``, ``a list``."""
    if isinstance(value, str):
        return repr(value)
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


def quoted_list(names: list[str]) -> str:
    """``["a", "b"]`` → ``a, b``; an empty list → ``none``."""
    return ", ".join(names) if names else "none"
