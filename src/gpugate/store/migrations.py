"""The migration files shipped with the package, found and ordered; the backends apply them.

A migration is ``sql/<backend>/NNNN_name.sql``: a four-digit version and a snake-case name. Each
backend applies the pending ones in version order inside one locked transaction and records them
in ``schema_migrations``. Adding a migration means adding a file for every backend.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

from gpugate.errors import MigrationError
from gpugate.store.dialect import sql
from gpugate.store.tx import one

if TYPE_CHECKING:
    from collections.abc import Collection

    from gpugate.store.tx import Tx

_FILE_NAME = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")
_HAS_SCHEMA_MIGRATIONS = sql(
    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'",
    postgres="SELECT to_regclass('schema_migrations') IS NOT NULL",
)
_SCHEMA_VERSION = sql("SELECT coalesce(max(version), 0) FROM schema_migrations")


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema change: its version, its name (the file's stem) and its SQL."""

    version: int
    name: str
    sql: str


def load_migrations(backend: str) -> list[Migration]:
    """Every migration shipped for ``backend``, oldest first."""
    folder = resources.files(__package__) / "sql" / backend
    if not folder.is_dir():
        raise MigrationError(f"no migrations shipped for the {backend} store")
    found: dict[int, Migration] = {}
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILE_NAME.match(entry.name)
        if match is None:
            raise MigrationError(f"migration file {backend}/{entry.name} is not NNNN_name.sql")
        version = int(match["version"])
        if version in found:
            raise MigrationError(f"two {backend} migrations share version {version:04d}")
        found[version] = Migration(version, entry.name.removesuffix(".sql"), entry.read_text())
    return [found[version] for version in sorted(found)]


def pending(migrations: list[Migration], applied: Collection[int]) -> list[Migration]:
    """The migrations not applied yet, in the order to apply them."""
    return [migration for migration in migrations if migration.version not in applied]


def schema_version() -> Tx[int]:
    """The newest applied migration, 0 on an empty database (no ``schema_migrations`` yet)."""
    if not (yield from one(_HAS_SCHEMA_MIGRATIONS))[0]:
        return 0
    return int((yield from one(_SCHEMA_VERSION))[0])
