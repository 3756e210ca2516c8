"""The environment variables a config needs: secrets are named in the file, never written there.

Required: every push runtime's ``push.secret_env``, every modal runtime's ``modal.token_id_env``
and ``modal.token_secret_env``, an upstream's ``api_key_env`` when given, and the S3 blob
store's ``access_key_id_env`` / ``secret_access_key_env`` when given.
``admin_token_env`` is not required: unset, the admin API refuses everything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpugate.config.paths import Finding, KeyPath
from gpugate.config.validation import to_problems

if TYPE_CHECKING:
    from gpugate.config.schema import GatewayConfig
    from gpugate.errors import ConfigProblem

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODAL_DEFAULTS = (("token_id_env", "MODAL_TOKEN_ID"), ("token_secret_env", "MODAL_TOKEN_SECRET"))


def env_problems(config: GatewayConfig, environ: Mapping[str, str]) -> list[ConfigProblem]:
    """Each required variable that ``environ`` lacks or holds empty, at its key and line."""
    document = config.model_dump()
    return to_problems(env_findings(document, environ), config.source_map, document)


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
