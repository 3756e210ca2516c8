"""Small factories for config tests: documents as dicts, YAML text, and the problems they yield."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpugate.config import GatewayConfig, config_from_document, parse_config
from gpugate.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def upstream(
    upstream_id: str = "qwen", *, models: tuple[str, ...] = ("qwen",), **keys: Any
) -> dict[str, Any]:
    return {"id": upstream_id, "url": "http://127.0.0.1:8001", "models": list(models), **keys}


def push_runtime(
    runtime_id: str = "home-1", *, models: tuple[str, ...] = ("qwen",), **keys: Any
) -> dict[str, Any]:
    push = {"url": "http://127.0.0.1:9100/calls", "secret_env": "HOME1_WORKER_SECRET"}
    return {"id": runtime_id, "kind": "push", "models": list(models), "push": push, **keys}


def modal_runtime(
    runtime_id: str = "modal-beta", *, models: tuple[str, ...] = ("qwen",), **keys: Any
) -> dict[str, Any]:
    modal = {"app": "worker", "function": "generate"}
    return {"id": runtime_id, "kind": "modal", "models": list(models), "modal": modal, **keys}


def document(**keys: Any) -> dict[str, Any]:
    """A valid gateway document: one upstream serving ``qwen``, plus ``keys``."""
    return {"upstreams": [upstream()], **keys}


def as_yaml(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def problems_of_document(doc: dict[str, Any]) -> list[str]:
    """The problems ``config_from_document`` reports, as ``path: message`` strings."""
    try:
        config_from_document(doc)
    except ConfigError as exc:
        return [str(problem) for problem in exc.problems]
    return []


def problems_of_yaml(text: str) -> list[str]:
    """The problems ``parse_config`` reports, as ``path: message (line N)`` strings."""
    try:
        parse_config(text)
    except ConfigError as exc:
        return [str(problem) for problem in exc.problems]
    return []


def config_of(**keys: Any) -> GatewayConfig:
    return config_from_document(document(**keys))
