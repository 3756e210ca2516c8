"""One way from a document to a config: every problem, from every check, at once.

The schema (pydantic), the cross-field rules and anything the caller found before (duplicate
YAML keys, unset environment variables) are collected, given their lines from the source map,
and raised together as one :class:`~gpugate.errors.ConfigError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpugate.config.paths import Finding, KeyPath, describe, format_path
from gpugate.config.problems import schema_findings
from gpugate.config.rules import resolve_implied, rule_findings, unserved_fallbacks
from gpugate.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from gpugate.config.schema import GatewayConfig
    from gpugate.config.source_map import SourceMap

# Passed as pydantic's validation context: the caller has run the cross-field rules already,
# so the model must not run them again (and report them twice, without paths).
RULES_CHECKED = "gpugate.config.rules_checked"

ModelT = TypeVar("ModelT", bound=BaseModel)
_NO_LINE = 1 << 30


def validate_document(
    model: type[ModelT],
    data: Any,
    source_map: SourceMap,
    *,
    source: str | None,
    found: Iterable[Finding] = (),
) -> ModelT:
    """``data`` validated as ``model``, or :class:`ConfigError` with every problem.

    ``found`` are problems the caller found already (duplicate keys, unset variables).
    """
    findings = list(found)
    if not isinstance(data, Mapping):
        got = describe(data)
        findings.append(Finding((), f"expected a mapping of configuration keys, got {got}"))
        raise ConfigError(to_problems(findings, source_map, data), source=source)
    resolved = resolve_implied(data)
    config: ModelT | None = None
    try:
        config = model.model_validate(resolved, context={RULES_CHECKED: True})
    except ValidationError as exc:
        findings += schema_findings(exc, resolved, model)
    findings += rule_findings(resolved, default_implied=data.get("default_runtime") is None)
    if findings or config is None:
        raise ConfigError(to_problems(findings, source_map, resolved), source=source)
    return config


def fallback_warnings(config: GatewayConfig) -> list[ConfigProblem]:
    """The fallbacks no upstream serves (:func:`~gpugate.config.rules.unserved_fallbacks`), at
    their lines: warned about, not refused."""
    return located(config, unserved_fallbacks)


def located(
    config: GatewayConfig, find: Callable[[Mapping[str, Any]], Iterable[Finding]]
) -> list[ConfigProblem]:
    """What ``find`` finds in a loaded config's document, as problems at their lines."""
    document = config.model_dump()
    return to_problems(find(document), config.source_map, document)


def to_problems(
    findings: Iterable[Finding], source_map: SourceMap, data: Any = None
) -> list[ConfigProblem]:
    """Findings as problems with their lines, de-duplicated, in the order of the document.

    The order is by line, then by where the path points in ``data`` (for a document without
    lines, or several problems on one line).
    """
    problems: dict[tuple[str, str], tuple[tuple[int, ...], ConfigProblem]] = {}
    for finding in findings:
        line = finding.line if finding.line is not None else source_map.line(finding.path)
        problem = ConfigProblem(format_path(finding.path), finding.message, line)
        order = (_NO_LINE if line is None else line, *_positions(finding.path, data))
        problems.setdefault((problem.path, problem.message), (order, problem))
    return [problem for _, problem in sorted(problems.values(), key=lambda item: item[0])]


def _positions(path: KeyPath, data: Any) -> list[int]:
    """Where each step of ``path`` is in ``data``: a list index, or a key's place in its mapping."""
    positions = []
    node = data
    for part in path:
        if isinstance(node, list) and isinstance(part, int):
            positions.append(part)
            node = node[part] if 0 <= part < len(node) else None
        elif isinstance(node, Mapping):
            keys = [str(key) for key in node]
            position = keys.index(str(part)) if str(part) in keys else len(keys)
            positions.append(position)
            node = list(node.values())[position] if position < len(keys) else None
        else:
            positions.append(_NO_LINE)
            node = None
    return positions
