"""The gateway document as an operator exports and imports it: JSON or YAML text (DESIGN §2).

    parse_gateway_text(base, text, media=...)     text → GatewayConfig (ConfigError: every
                                                   problem, with its line for YAML/broken JSON)
    render_gateway_document(document, media=...)  document → text in the file's schema

An import replaces the gateway document whole; the process keys stay those of ``base`` (the file
this process was started with). A ``*_env`` variable the new document names must be one an
import may use (``environ`` is :func:`~gpugate.config.environment.importable_environ`'s view:
set, and allowed by the process), else it is a problem — the same one whether the variable is
unset or not allowed, so an import cannot probe the environment (issue #15 finding 5).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import yaml

from gpugate.config.environment import import_findings
from gpugate.config.paths import format_path
from gpugate.config.schema import GATEWAY_KEYS
from gpugate.config.source_map import SourceMap, read_yaml
from gpugate.config.untrusted import first_problem, parse_json
from gpugate.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from gpugate.config.schema import GatewayConfig

Media = Literal["json", "yaml"]
SOURCE = "<import>"


def parse_gateway_text(
    base: GatewayConfig, text: str, *, media: Media, environ: Mapping[str, str]
) -> GatewayConfig:
    """``base`` with its gateway document replaced by the one in ``text``, validated whole;
    ``environ`` holds only the variables an import may name."""
    if media == "yaml":
        parsed = read_yaml(text, source=SOURCE)
        data, source_map, found = parsed.data, parsed.source_map, list(parsed.duplicates)
    else:
        data, source_map, found = _read_json(text), SourceMap(), []
    if data is None:
        problem = ConfigProblem("", "the document is empty: expected at least upstreams")
        raise ConfigError([problem], source=SOURCE)
    if isinstance(data, Mapping):
        gateway_part = {key: value for key, value in data.items() if key in GATEWAY_KEYS}
        found += import_findings(gateway_part, environ)
    return base.with_gateway_document(data, source=SOURCE, source_map=source_map, found=found)


def render_gateway_document(document: Mapping[str, Any], *, media: Media) -> str:
    """The document as JSON (indented) or YAML (block style, keys in the schema's order)."""
    if media == "yaml":
        return yaml.safe_dump(dict(document), sort_keys=False, allow_unicode=True)
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def _read_json(text: str) -> Any:
    try:
        data = parse_json(text)
    except json.JSONDecodeError as exc:
        problem = ConfigProblem("", f"invalid JSON: {exc.msg} (column {exc.colno})", exc.lineno)
        raise ConfigError([problem], source=SOURCE) from exc
    except ValueError as exc:  # nested past the limit
        raise ConfigError([ConfigProblem("", f"invalid JSON: {exc}")], source=SOURCE) from exc
    if (bad := first_problem(data)) is not None:
        raise ConfigError([ConfigProblem(format_path(bad.path), bad.message)], source=SOURCE)
    return data
