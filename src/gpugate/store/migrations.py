"""The migration files shipped with the package, found, ordered and rendered for a backend; the
backends apply them.

A migration is ``sql/NNNN_name.sql``: a four-digit version and a snake-case name, one file for
both backends. Each backend applies the pending ones in version order inside one locked
transaction and records them in ``schema_migrations``. The file is the schema written once; what
differs between the two is said where it differs, three ways:

- a named type in braces, ``{TIME}``, ``{JSON}``, ... (:data:`NAMES`): SQLite keeps timestamps as
  fixed-width ISO-8601 UTC text (they compare as strings), JSON as text, booleans as 0 and 1;
- ``{sqlite: ...}`` or ``{postgres: ...}`` inside a line: that text for that backend only;
- the lines after ``-- if sqlite`` or ``-- if postgres``, up to the next such line or ``-- end``:
  for that backend only (indexes chosen for each planner, a statement in one dialect).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

from gpugate.errors import MigrationError
from gpugate.store.dialect import POSTGRES, SQLITE, sql
from gpugate.store.tx import one

if TYPE_CHECKING:
    from collections.abc import Collection

    from gpugate.store.tx import Tx

_FILE_NAME = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")
#: What each named type of a migration is in each backend's SQL.
NAMES: dict[str, dict[str, str]] = {
    SQLITE: {
        "ID": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "BIGINT": "INTEGER",
        "JSON": "TEXT",
        "TIME": "TEXT",
        "DATE": "TEXT",
        "REAL": "REAL",
        "BYTES": "BLOB",
        "BOOL": "INTEGER",
        "TRUE": "1",
        "FALSE": "0",
        "STRPOS": "instr",
    },
    POSTGRES: {
        "ID": "bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        "BIGINT": "bigint",
        "JSON": "jsonb",
        "TIME": "timestamptz",
        "DATE": "date",
        "REAL": "double precision",
        "BYTES": "bytea",
        "BOOL": "boolean",
        "TRUE": "true",
        "FALSE": "false",
        "STRPOS": "strpos",
    },
}
_NAME = re.compile(r"\{([A-Z]+)\}")  # not '{}', a JSON default
_ONLY = re.compile(r"\{(\w+):([^{}]*)\}")
_BLOCK = re.compile(r"-- (?:if (\w+)|end)")
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
    """Every migration shipped, rendered for ``backend``, oldest first."""
    if backend not in NAMES:
        raise MigrationError(f"no migrations shipped for the {backend} store")
    found: dict[int, Migration] = {}
    for entry in (resources.files(__package__) / "sql").iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILE_NAME.match(entry.name)
        if match is None:
            raise MigrationError(f"migration file {entry.name} is not NNNN_name.sql")
        version = int(match["version"])
        if version in found:
            raise MigrationError(f"two migrations share version {version:04d}")
        text = render(entry.read_text(), backend, entry.name)
        found[version] = Migration(version, entry.name.removesuffix(".sql"), text)
    return [found[version] for version in sorted(found)]


def render(text: str, backend: str, where: str = "the migration") -> str:
    """A migration's SQL for ``backend``: its blocks chosen, its inline parts and names put in
    (the module's docstring); a name, a backend or a block it does not know is an error that
    says where."""
    names = NAMES[backend]
    kept: list[str] = []
    only: str | None = None  # the backend of the block we are in
    for number, line in enumerate(text.splitlines(), 1):
        block = _BLOCK.fullmatch(line.rstrip())
        if block is not None:
            only = block[1]
            if only is not None and only not in NAMES:
                raise MigrationError(
                    f"{where}:{number}: no backend {only!r} (-- if sqlite|postgres)"
                )
            continue
        if only is not None and only != backend:
            continue
        for part in _ONLY.finditer(line):
            if part[1] not in NAMES:
                raise MigrationError(f"{where}:{number}: no backend {part[1]!r} in {part[0]!r}")
        chosen = _ONLY.sub(lambda part: part[2] if part[1] == backend else "", line)
        for name in _NAME.findall(chosen):
            if name not in names:
                raise MigrationError(f"{where}:{number}: no type {{{name}}} ({', '.join(names)})")
        kept.append(_NAME.sub(lambda name: names[name[1]], chosen))
    if only is not None:
        raise MigrationError(f"{where}: the last '-- if {only}' has no '-- end'")
    return "\n".join(kept) + "\n"


def pending(migrations: list[Migration], applied: Collection[int]) -> list[Migration]:
    """The migrations not applied yet, in the order to apply them."""
    return [migration for migration in migrations if migration.version not in applied]


def schema_version() -> Tx[int]:
    """The newest applied migration, 0 on an empty database (no ``schema_migrations`` yet)."""
    if not (yield from one(_HAS_SCHEMA_MIGRATIONS))[0]:
        return 0
    return int((yield from one(_SCHEMA_VERSION))[0])
