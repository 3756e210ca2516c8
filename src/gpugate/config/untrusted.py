"""Documents from outside the process, bounded before anything else looks at them.

Every JSON body and every YAML text the gateway reads from outside (request bodies, config
imports, the config file) passes here first, so that no document can cost more than its size:

    parse_json(raw)        JSON text → data; ValueError for malformed JSON or nesting past
                           MAX_DEPTH (never RecursionError)
    yaml_events_problem()  a YAML event stream's depth and its size *with aliases expanded*,
                           checked before the node tree is built (an alias bomb of 300 bytes
                           expands to billions of nodes)
    first_problem(data)    the first value no store can hold or no JSON can say: nesting past
                           MAX_DEPTH, NaN or ±Infinity, text with a NUL character or a lone
                           UTF-16 surrogate (PostgreSQL refuses both; SQLite would keep them)

Each problem is a :class:`~gpugate.config.paths.Finding` (a key path and a message); the caller
says it in its own error (a 400 naming the path, or a config problem with its line).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from gpugate.config.paths import Finding, KeyPath

if TYPE_CHECKING:
    from collections.abc import Iterable

MAX_DEPTH = 64
"""How deep objects and lists (mappings and sequences) may nest in any document we read."""

MAX_YAML_NODES = 100_000
"""How many nodes a YAML document may hold once its aliases are expanded (a config with 500
upstreams holds about 10,000)."""

NUL = "\x00"


def parse_json(raw: str | bytes) -> Any:
    """``raw`` as JSON data; :class:`ValueError` when it is not JSON or nests past MAX_DEPTH.

    Python's parser recurses per level: a document deep enough to exhaust the stack is refused
    here with a message instead of a RecursionError.
    """
    try:
        return json.loads(raw)
    except RecursionError as exc:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from exc


def first_problem(data: Any, *, max_depth: int = MAX_DEPTH) -> Finding | None:
    """The first value of ``data`` that no document may hold (see the module docstring), with
    its key path; ``None`` when every value is fine. Iterative, so depth cannot hurt it."""
    if not isinstance(data, dict | list):
        return _scalar_problem(data, ())
    stack: list[tuple[dict[Any, Any] | list[Any], KeyPath]] = [(data, ())]
    while stack:
        container, path = stack.pop()
        if len(path) >= max_depth:
            return Finding((), f"nested deeper than {max_depth} levels")  # the whole document
        items: Iterable[tuple[Any, Any]] = (
            container.items() if isinstance(container, dict) else enumerate(container)
        )
        for key, value in items:
            if isinstance(key, str) and (problem := _text_problem(key)):
                return Finding(path, f"a key {problem}")
            where = (*path, key if isinstance(key, int | str) else str(key))
            if isinstance(value, dict | list):
                stack.append((value, where))
            elif (finding := _scalar_problem(value, where)) is not None:
                return finding
    return None


def _scalar_problem(value: Any, path: KeyPath) -> Finding | None:
    if isinstance(value, str):
        problem = _text_problem(value)
        return None if problem is None else Finding(path, f"text {problem}")
    if isinstance(value, float) and not math.isfinite(value):
        return Finding(path, f"expected a finite number, got {value}")
    return None


def _text_problem(text: str) -> str | None:
    if NUL in text:
        return "holds a NUL character (\\u0000)"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "holds a lone UTF-16 surrogate (not a character)"
    return None


@dataclass(slots=True)
class _Open:
    """A mapping or sequence whose end event has not come yet."""

    anchor: str | None
    nodes_before: int  # nodes counted before this one started
    level: int  # 1 for a top-level collection
    deepest: int  # the deepest level reached inside it so far


@dataclass(frozen=True, slots=True)
class YamlLimitProblem:
    """A YAML stream over a limit: what, and the 1-based line where it was found."""

    message: str
    line: int


class _Tally:
    """The running count of :func:`yaml_events_problem`: nodes so far (aliases expanded), the
    collections still open, and each complete anchor's size and depth."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.nodes = 0
        self.stack: list[_Open] = []
        self.sizes: dict[str, tuple[int, int]] = {}  # anchor -> (nodes, levels below its own)

    def start(self, anchor: str | None) -> str | None:
        self.nodes += 1
        level = len(self.stack) + 1
        self.stack.append(_Open(anchor, self.nodes - 1, level, level))
        return self._too_deep(level)

    def end(self) -> None:
        done = self.stack.pop()
        self._reach(done.deepest)
        if done.anchor is not None:
            self.sizes[done.anchor] = (self.nodes - done.nodes_before, done.deepest - done.level)

    def scalar(self, anchor: str | None) -> None:
        self.nodes += 1
        if anchor is not None:
            self.sizes[anchor] = (1, -1)

    def alias(self, anchor: str) -> str | None:
        if anchor not in self.sizes:
            return (
                f"alias *{anchor} refers to an anchor that is not complete here "
                "(undefined, or a document that contains itself)"
            )
        size, below = self.sizes[anchor]
        self.nodes += size
        reach = len(self.stack) + 1 + below
        self._reach(reach)
        return self._too_deep(reach)

    def _reach(self, level: int) -> None:
        if self.stack:
            self.stack[-1].deepest = max(self.stack[-1].deepest, level)

    def _too_deep(self, level: int) -> str | None:
        if level > self.max_depth:
            return f"the document nests deeper than {self.max_depth} levels"
        return None


def yaml_events_problem(
    events: Iterable[yaml.Event],
    *,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_YAML_NODES,
) -> YamlLimitProblem | None:
    """The first limit ``events`` (``yaml.parse``) break, counting each alias as the whole
    subtree it stands for; ``None`` within the limits. Stops at the first problem, so a bomb
    costs its text, not its expansion. An alias to a collection still open (a recursive
    document) is a problem too: no JSON can hold a cycle."""
    tally = _Tally(max_depth)
    for event in events:
        problem: str | None = None
        if isinstance(event, yaml.CollectionStartEvent):
            problem = tally.start(event.anchor)
        elif isinstance(event, yaml.CollectionEndEvent):
            tally.end()
        elif isinstance(event, yaml.ScalarEvent):
            tally.scalar(event.anchor)
        elif isinstance(event, yaml.AliasEvent):
            problem = tally.alias(str(event.anchor))
        if problem is None and tally.nodes > max_nodes:
            problem = f"the document holds more than {max_nodes} values, its aliases expanded"
        if problem is not None:
            line = event.start_mark.line + 1 if event.start_mark is not None else 1
            return YamlLimitProblem(problem, line)
    return None
