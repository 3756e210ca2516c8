"""Reading a configuration: a YAML file, YAML text or a document (a dict from JSON).

Every entry point validates the same way (:func:`.validation.validate_document`) and raises one
:class:`~gpugate.errors.ConfigError` listing every problem with its key path and, for text, its
line. This module is the one place the process environment is read for the config.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpugate.config.environment import env_findings
from gpugate.config.schema import GatewayConfig
from gpugate.config.source_map import SourceMap, read_yaml
from gpugate.config.validation import validate_document
from gpugate.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from gpugate.config.paths import Finding


def load_config(
    path: str | Path,
    *,
    environ: Mapping[str, str] | None = None,
    require_env: bool = False,
) -> GatewayConfig:
    """The config in the YAML file at ``path``.

    With ``require_env``, each required ``*_env`` variable unset or empty in ``environ``
    (default: the process environment) is a problem too.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise _unreadable(source, "no such file") from exc
    except IsADirectoryError as exc:
        raise _unreadable(source, "it is a directory, not a file") from exc
    except OSError as exc:
        raise _unreadable(source, exc.strerror or str(exc)) from exc
    except UnicodeDecodeError as exc:
        raise _unreadable(source, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    return parse_config(text, source=source, environ=environ, require_env=require_env)


def parse_config(
    text: str,
    *,
    source: str = "<string>",
    environ: Mapping[str, str] | None = None,
    require_env: bool = False,
) -> GatewayConfig:
    """The config in YAML ``text``; ``source`` names it in the error."""
    document = read_yaml(text, source=source)
    if document.data is None:
        problem = ConfigProblem("", "the file is empty: expected a mapping with at least upstreams")
        raise ConfigError([problem], source=source)
    found = list(document.duplicates)
    if require_env:
        found += _env_findings(document.data, environ)
    config = validate_document(
        GatewayConfig, document.data, document.source_map, source=source, found=found
    )
    return config.with_source_map(document.source_map)


def config_from_document(
    document: Mapping[str, Any],
    *,
    source: str = "<document>",
    environ: Mapping[str, str] | None = None,
    require_env: bool = False,
) -> GatewayConfig:
    """The config in a document (a dict, e.g. JSON from the store or an import); no lines."""
    found = _env_findings(document, environ) if require_env else []
    return validate_document(GatewayConfig, document, SourceMap(), source=source, found=found)


def _env_findings(data: Any, environ: Mapping[str, str] | None) -> list[Finding]:
    if not isinstance(data, Mapping):
        return []
    return env_findings(data, os.environ if environ is None else environ)


def _unreadable(source: str, reason: str) -> ConfigError:
    return ConfigError([ConfigProblem("", f"cannot read {source}: {reason}")], source=source)
