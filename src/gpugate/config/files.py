"""The files a config names that ``serve`` reads at start: the ``tls`` certificate chain, its
key and the client CA bundle.

Like the ``*_env`` variables (:mod:`.environment`) they belong to the machine ``serve`` runs
on, not to the file: ``check-config``, which often runs in CI without the certificates, reports
one it cannot read as a warning (an error with ``--strict-env``), and ``serve`` refuses to start
on it, naming the key and its line. Readable is all this checks: whether the PEM inside is a
certificate and a key that match is found when ``serve`` loads them
(:func:`gpugate.server.server_tls`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpugate.config.paths import Finding, KeyPath
from gpugate.config.validation import located

if TYPE_CHECKING:
    from gpugate.config.schema import GatewayConfig
    from gpugate.errors import ConfigProblem

_TLS_FILES = ("cert_file", "key_file", "client_ca_file")


def file_problems(config: GatewayConfig) -> list[ConfigProblem]:
    """Each file ``config`` names that cannot be read here, at its key and line."""
    return located(config, file_findings)


def file_findings(document: Mapping[str, Any]) -> list[Finding]:
    """:func:`file_problems` for a plain document, without lines."""
    findings = []
    for path, name in named_files(document):
        try:
            with Path(name).open("rb"):
                pass
        except OSError as exc:
            findings.append(Finding(path, f"cannot read {name}: {exc.strerror or exc}"))
    return findings


def named_files(document: Mapping[str, Any]) -> list[tuple[KeyPath, str]]:
    """Where each file ``serve`` reads at start is named, and its name."""
    tls = document.get("tls")
    if not isinstance(tls, Mapping):
        return []
    return [(("tls", key), tls[key]) for key in _TLS_FILES if isinstance(tls.get(key), str)]
