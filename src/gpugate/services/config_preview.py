"""What an import would do, before it does it: the validation problems, or the diff it would make.

A read: nothing is stored or applied. The proposed document is validated exactly as
:meth:`~gpugate.services.config_versions.ConfigVersions.import_text` validates it (the same
``parse_gateway_text`` against the config in effect and the same environment), and the diff is
between the current version and the proposed one, both rendered as YAML in the file's schema —
so a change of formatting or of key order is no change, and defaults show where they apply.
"""

from __future__ import annotations

import asyncio
import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpugate.config.gateway_import import parse_gateway_text, render_gateway_document
from gpugate.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from gpugate.config import GatewayConfig
    from gpugate.config.gateway_import import Media
    from gpugate.services.config_versions import VersionStore


@dataclass(frozen=True, slots=True)
class Preview:
    """The current version and, for a valid document, the unified diff an import would apply."""

    current_version: int
    current_text: str
    problems: list[ConfigProblem] = field(default_factory=list)
    diff: list[str] = field(default_factory=list)  # unified diff lines; empty = no change

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def changes(self) -> bool:
        return self.valid and bool(self.diff)


def media_of(text: str) -> Media:
    """JSON when the document starts with ``{``, else YAML (an upload carries no type we trust)."""
    return "json" if text.lstrip().startswith("{") else "yaml"


class ConfigPreview:
    """Validates a proposed gateway document against the config in effect and diffs it."""

    def __init__(
        self,
        store: VersionStore,
        current: Callable[[], tuple[GatewayConfig, int]],
        environ: Mapping[str, str],
    ) -> None:
        self._store = store
        self._current = current
        self._environ = environ

    async def preview(self, text: str) -> Preview:
        base, version = self._current()
        stored = await self._store.current_config()
        document = stored.document if stored is not None else base.gateway_document()
        current_text = render_gateway_document(document, media="yaml")
        try:
            proposed = await asyncio.to_thread(  # off the event loop
                parse_gateway_text, base, text, media=media_of(text), environ=self._environ
            )
        except ConfigError as exc:
            return Preview(version, current_text, problems=list(exc.problems))
        proposed_text = render_gateway_document(proposed.gateway_document(), media="yaml")
        diff = difflib.unified_diff(
            current_text.splitlines(),
            proposed_text.splitlines(),
            fromfile=f"version {version}",
            tofile="import",
            lineterm="",
        )
        return Preview(version, current_text, diff=list(diff))

    def __repr__(self) -> str:
        return f"<ConfigPreview in_effect={self._current()[1]}>"
