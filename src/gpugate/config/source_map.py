"""Where each key of a YAML document is: key path → 1-based line.

:func:`read_yaml` first reads the text as events and refuses a document past the limits of
:mod:`.untrusted` (depth, and size with every alias expanded: an alias bomb is refused for the
cost of its text). Then it composes the node tree once (``yaml.compose`` with the safe loader,
libyaml's when installed), builds the data from it with the safe constructor, refuses values no
JSON or store can hold (NaN, NUL, lone surrogates), and walks the same tree for the lines and
for duplicate keys, which PyYAML would otherwise silently resolve to the last value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from gpugate.config.paths import Finding, KeyPath, format_path
from gpugate.config.untrusted import first_problem, yaml_events_problem
from gpugate.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from collections.abc import Mapping

_MERGE_TAG = "tag:yaml.org,2002:merge"
# libyaml's parser and composer when PyYAML was built with it (10-20x faster), else PyYAML's own.
_LOADER: type[yaml.SafeLoader | yaml.CSafeLoader] = (
    yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader
)


@dataclass(frozen=True, slots=True)
class SourceMap:
    """The line of each key path of a document; empty for a document that had no text."""

    lines: Mapping[KeyPath, int] = field(default_factory=dict)

    def line(self, path: KeyPath) -> int | None:
        """The line of ``path``, else of its nearest ancestor with one (a missing key's parent)."""
        for depth in range(len(path), -1, -1):
            line = self.lines.get(path[:depth])
            if line is not None:
                return line
        return None

    def without(self, top_level_keys: frozenset[str]) -> SourceMap:
        """This map minus everything under the given top-level keys, and minus the root.

        What remains describes a document merged from two sources: the root line belongs to
        neither, so a problem in the other part gets no line rather than a wrong one.
        """
        kept = {
            path: line
            for path, line in self.lines.items()
            if path and path[0] not in top_level_keys
        }
        return SourceMap(kept)


@dataclass(frozen=True, slots=True)
class YamlDocument:
    """A parsed YAML text: its data, its lines and the duplicate keys found on the way."""

    data: Any
    source_map: SourceMap
    duplicates: tuple[Finding, ...]


def read_yaml(text: str, *, source: str | None = None) -> YamlDocument:
    """Parse ``text``; malformed YAML, or YAML past a limit, raises :class:`ConfigError` with one
    problem and its line."""
    try:
        limit = yaml_events_problem(yaml.parse(text, Loader=_LOADER))
        if limit is not None:
            problem = ConfigProblem("", limit.message, limit.line)
            raise ConfigError([problem], source=source)
        node = yaml.compose(text, Loader=_LOADER)
        data = SafeConstructor().construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_problem(exc)], source=source) from exc
    lines: dict[KeyPath, int] = {}
    duplicates: list[Finding] = []
    if node is not None:
        lines[()] = node.start_mark.line + 1
        _walk(node, (), _Walk(lines, duplicates, SafeConstructor(), set()))
    source_map = SourceMap(lines)
    if (bad := first_problem(data)) is not None:
        problem = ConfigProblem(format_path(bad.path), bad.message, source_map.line(bad.path))
        raise ConfigError([problem], source=source)
    return YamlDocument(data, source_map, tuple(duplicates))


def _yaml_problem(exc: yaml.YAMLError) -> ConfigProblem:
    if isinstance(exc, yaml.MarkedYAMLError):
        what = exc.problem or "cannot parse"
        if exc.context:
            what += f" ({exc.context})"
        mark = exc.problem_mark or exc.context_mark
        return ConfigProblem("", f"invalid YAML: {what}", mark.line + 1 if mark else None)
    return ConfigProblem("", f"invalid YAML: {exc}")


@dataclass(frozen=True, slots=True)
class _Walk:
    lines: dict[KeyPath, int]
    duplicates: list[Finding]
    constructor: SafeConstructor
    active: set[int]  # ids of the nodes on the current branch: an alias cycle stops the walk


def _walk(node: Node, path: KeyPath, walk: _Walk) -> None:
    if id(node) in walk.active:
        return
    walk.active.add(id(node))
    if isinstance(node, MappingNode):
        _walk_mapping(node, path, walk)
    elif isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            walk.lines[(*path, index)] = item.start_mark.line + 1
            _walk(item, (*path, index), walk)
    walk.active.discard(id(node))


def _walk_mapping(node: MappingNode, path: KeyPath, walk: _Walk) -> None:
    last: dict[str, tuple[Node, Node]] = {}
    for key_node, value_node in node.value:
        key = _key_text(key_node, walk.constructor)
        if key is None:
            continue
        if key in last:
            first_line = last[key][0].start_mark.line + 1
            walk.duplicates.append(
                Finding(
                    (*path, key),
                    f"duplicate key '{key}' (first at line {first_line}); a key may appear once",
                    key_node.start_mark.line + 1,
                )
            )
        last[key] = (key_node, value_node)
    for key, (key_node, value_node) in last.items():
        walk.lines[(*path, key)] = key_node.start_mark.line + 1
        _walk(value_node, (*path, key), walk)


def _key_text(key_node: Node, constructor: SafeConstructor) -> str | None:
    """A mapping key as the data holds it, as text; ``None`` for merge keys and complex keys."""
    if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE_TAG:
        return None
    return str(constructor.construct_object(key_node))
