"""The environment variables a config needs: secrets are named in the file, never written there.

Required: every push runtime's ``push.secret_env``, every modal runtime's ``modal.token_id_env``
and ``modal.token_secret_env``, an upstream's ``api_key_env`` when given, and the S3 blob
store's ``access_key_id_env`` / ``secret_access_key_env`` when given.
``admin_token_env`` is not required: unset, the admin API refuses everything.

What a config *import* may name (issue #15 finding 5): the file is the operator's, so it may name
any variable; an import (admin API, console) may name only the variables the process allows —
those starting with ``import_env.prefix`` (``GPUGATE_SECRET_``), those in ``import_env.allow``,
and those the file's own gateway document names — and never one a process key names (the admin
token's, the blob store's keys). :func:`importable_environ` is that view of the environment;
:func:`import_findings` checks a document against it with one message for a variable that is
unset, empty or not allowed alike, so an import learns nothing about which variables exist.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field

from gpugate.config.fields import ConfigModel, EnvName
from gpugate.config.paths import Finding, KeyPath
from gpugate.config.validation import located

if TYPE_CHECKING:
    from gpugate.config.schema import GatewayConfig
    from gpugate.errors import ConfigProblem

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODAL_DEFAULTS = (("token_id_env", "MODAL_TOKEN_ID"), ("token_secret_env", "MODAL_TOKEN_SECRET"))
IMPORT_PREFIX = "GPUGATE_SECRET_"  # a prefix of variable names


class ImportEnvConfig(ConfigModel):
    """Which environment variables a config import may name in a ``*_env`` key (a process
    key: only the file sets it, an import cannot widen it)."""

    prefix: EnvName | None = IMPORT_PREFIX
    allow: list[EnvName] = Field(default_factory=list)

    def allows(self, name: str) -> bool:
        """Whether ``name`` passes the prefix or the allow-list (not yet the other rules)."""
        return name in self.allow or (self.prefix is not None and name.startswith(self.prefix))


def env_problems(config: GatewayConfig, environ: Mapping[str, str]) -> list[ConfigProblem]:
    """Each required variable that ``environ`` lacks or holds empty, at its key and line."""
    return located(config, lambda document: env_findings(document, environ))


def env_findings(document: Mapping[str, Any], environ: Mapping[str, str]) -> list[Finding]:
    """:func:`env_problems` for a plain document (as far as it can be read), without lines."""
    findings = []
    for path, name in required_env(document):
        value = environ.get(name)
        if value is None:
            findings.append(Finding(path, f"environment variable {name} is not set"))
        elif not value:
            findings.append(Finding(path, f"environment variable {name} is set but empty"))
    return findings


def importable_environ(config: GatewayConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a config import may name, with their values (set and non-empty only):
    ``import_env``'s prefix and allow-list, and the names the file's own gateway document uses
    (``config`` is the file's config) — less every name a process key uses."""
    policy = config.import_env
    named_by_file = {name for _, name in named_env(config.gateway_document())}
    process = {name for _, name in named_env(config.process_document())}
    return {
        name: value
        for name, value in environ.items()
        if value and name not in process and (policy.allows(name) or name in named_by_file)
    }


def import_findings(document: Mapping[str, Any], importable: Mapping[str, str]) -> list[Finding]:
    """Each ``*_env`` variable ``document`` names that is not in ``importable``; the message
    is the same whether it is unset, empty or not allowed."""
    return [
        Finding(
            path,
            f"environment variable {name} is not available to a config import: it must be "
            "set, and allowed by the process (import_env.prefix, import_env.allow, or named by "
            "the config file)",
        )
        for path, name in named_env(document)
        if name not in importable
    ]


def named_env(document: Mapping[str, Any]) -> list[tuple[KeyPath, str]]:
    """Every variable a document names: each ``*_env`` key anywhere in it, and the defaults
    the schema fills in (a modal runtime's token variables), without duplicates."""
    found: dict[KeyPath, str] = dict(required_env(document))

    def walk(node: Any, path: KeyPath) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                here = (*path, str(key))
                if str(key).endswith("_env") and isinstance(value, str):
                    if _ENV_NAME.fullmatch(value):
                        found.setdefault(here, value)
                else:
                    walk(value, here)
        elif isinstance(node, list):
            for index, item in enumerate(node):
                walk(item, (*path, index))

    walk(document, ())
    return list(found.items())


def required_env(document: Mapping[str, Any]) -> list[tuple[KeyPath, str]]:
    """Where each required variable is named, and its name."""
    named: list[tuple[KeyPath, Any]] = []
    for index, upstream in _items(document.get("upstreams")):
        if upstream.get("api_key_env") is not None:
            named.append((("upstreams", index, "api_key_env"), upstream["api_key_env"]))
    for index, runtime in _items(document.get("runtimes")):
        kind = runtime.get("kind")
        block = runtime.get(kind) if kind in ("push", "modal") else None
        if not isinstance(block, Mapping):
            continue
        keys = (("secret_env", None),) if kind == "push" else _MODAL_DEFAULTS
        for key, default in keys:
            named.append((("runtimes", index, str(kind), key), block.get(key, default)))
    blobs = document.get("blobs")
    s3 = blobs.get("s3") if isinstance(blobs, Mapping) else None
    if isinstance(s3, Mapping):
        named.extend(
            (("blobs", "s3", name), s3[name])
            for name in ("access_key_id_env", "secret_access_key_env")
            if s3.get(name) is not None
        )
    return [
        (path, name) for path, name in named if isinstance(name, str) and _ENV_NAME.fullmatch(name)
    ]


def _items(section: Any) -> list[tuple[int, Mapping[str, Any]]]:
    if not isinstance(section, list):
        return []
    return [(index, item) for index, item in enumerate(section) if isinstance(item, Mapping)]
