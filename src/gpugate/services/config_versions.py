"""The gateway config as numbered versions in the store: export, import, rollback, and every
replica following the newest version without a restart (DESIGN §2).

* :meth:`ConfigVersions.import_text` validates a whole document first (every problem at once:
  an invalid import stores nothing and applies nothing), stores it as the next version (the
  store audits it in the same transaction) and applies it here at once. A document equal to the
  current version changes nothing: no new version.
* :meth:`ConfigVersions.rollback` stores an earlier version's document as a new version, checked
  like an import against the variables an import may name (``environ``).
* :meth:`ConfigVersions.tick` (every ``server.config_poll_s`` in :meth:`run`) applies the store's
  newest version when another replica stored it, so every replica follows within one poll.

Applying is the composition root's ``apply(config, version)``: a synchronous swap of the live
views (registry, chain, runtimes), so no request ever sees half of a change.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpugate.config.environment import import_findings
from gpugate.config.gateway_import import parse_gateway_text
from gpugate.errors import ConfigError, GpugateError, UnknownConfigVersion

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from gpugate.clock import Clock
    from gpugate.config import GatewayConfig
    from gpugate.config.gateway_import import Media
    from gpugate.store import ConfigVersion

log = logging.getLogger("gpugate.config")


class VersionStore(Protocol):
    """The slice of the store the config versions use (:class:`gpugate.store.Store`'s)."""

    async def current_config(self) -> ConfigVersion | None: ...

    async def get_config(self, version: int) -> ConfigVersion | None: ...

    async def list_configs(self, limit: int = 50) -> list[ConfigVersion]: ...

    async def save_config(
        self, document: dict[str, Any], *, actor: str, note: str
    ) -> ConfigVersion: ...


@dataclass(frozen=True, slots=True)
class Imported:
    """What an import or a rollback did: the version now current, and whether it is new."""

    version: int
    changed: bool


class ConfigVersions:
    """Export, import, versions and rollback of the gateway config; follows the store's newest."""

    def __init__(
        self,
        store: VersionStore,
        current: Callable[[], tuple[GatewayConfig, int]],
        apply: Callable[[GatewayConfig, int], None],
        environ: Mapping[str, str],  # the variables an import may name (importable_environ)
        clock: Clock,
        *,
        poll_s: float,
    ) -> None:
        self._store = store
        self._current = current
        self._apply = apply
        self._environ = environ
        self._clock = clock
        self._poll_s = poll_s
        self.applied = 0  # versions this process applied after start-up

    async def export(self) -> ConfigVersion:
        """The store's current version (seeded at start-up, so there always is one)."""
        current = await self._store.current_config()
        if current is None:  # pragma: no cover - build_gateway seeds version 1 before serving
            raise GpugateError("no gateway config version is stored")
        return current

    async def versions(self, limit: int = 50) -> list[ConfigVersion]:
        """Stored versions, newest first."""
        return await self._store.list_configs(limit)

    async def import_text(self, text: str, *, media: Media, actor: str) -> Imported:
        """Replace the gateway document with the one in ``text`` (validated first, atomic); the
        text is parsed and validated in a worker thread, off the event loop."""
        base, _ = self._current()
        parse = parse_gateway_text
        config = await asyncio.to_thread(parse, base, text, media=media, environ=self._environ)
        return await self._save(config, actor=actor, note="import", always=False)

    async def rollback(self, version: int, *, actor: str) -> Imported:
        """Store version ``version``'s document again as a new version, and apply it."""
        stored = await self._store.get_config(version)
        if stored is None:
            raise UnknownConfigVersion(f"no stored gateway config version {version}")
        base, _ = self._current()
        found = import_findings(stored.document, self._environ)
        try:
            config = base.with_gateway_document(
                stored.document, source=f"version {version}", found=found
            )
        except ConfigError as exc:  # an old version that no longer validates (a newer schema)
            raise ConfigError(exc.problems, source=f"version {version}") from exc
        return await self._save(config, actor=actor, note=f"rollback to {version}", always=True)

    async def tick(self) -> bool:
        """Apply the store's newest version if it is not the one in effect; True when applied."""
        current = await self._store.current_config()
        _, in_effect = self._current()
        if current is None or current.version == in_effect:
            return False
        base, _ = self._current()
        try:
            config = base.with_gateway_document(current.document)
        except ConfigError as exc:
            log.error(  # noqa: TRY400 - the problems are the message; no traceback helps
                "gateway config version %d does not validate here: %s", current.version, exc
            )
            return False
        self._apply_version(config, current.version)
        return True

    async def run(self) -> None:
        """Follow the store's newest version, every ``poll_s``; a failed poll is logged."""
        while True:
            await self._clock.sleep(self._poll_s)
            try:
                await self.tick()
            except GpugateError as exc:
                log.warning("cannot read the gateway config version: %s", exc.message)

    async def _save(
        self, config: GatewayConfig, *, actor: str, note: str, always: bool
    ) -> Imported:
        document = config.gateway_document()
        current = await self._store.current_config()
        if not always and current is not None and current.document == document:
            return Imported(current.version, changed=False)
        saved = await self._store.save_config(document, actor=actor, note=note)
        self._apply_version(config, saved.version)
        return Imported(saved.version, changed=True)

    def _apply_version(self, config: GatewayConfig, version: int) -> None:
        _, in_effect = self._current()
        if version <= in_effect:
            return  # a newer version is in effect already (another import raced this one)
        self._apply(config, version)
        self.applied += 1
        log.info("gateway config version %d is in effect", version)

    def __repr__(self) -> str:
        return f"<ConfigVersions in_effect={self._current()[1]} applied={self.applied}>"
