"""Which store a DSN names: the one place that knows the concrete back ends."""

from __future__ import annotations

from gpugate.clock import Clock
from gpugate.errors import StoreError
from gpugate.store.sql_store import Store

ACCEPTED_DSNS = (
    "sqlite:///relative/path.db, sqlite:////absolute/path.db, "
    "postgresql://user@host:port/db (or postgres://...)"
)


def open_store(dsn: str, *, clock: Clock) -> Store:
    """The store a DSN names, not yet opened; StoreError when the DSN is none of ACCEPTED_DSNS."""
    scheme, separator, rest = dsn.partition("://")
    if separator and scheme in {"postgresql", "postgres"}:
        from gpugate.store.postgres import PostgresStore  # psycopg loads only when it is used

        return PostgresStore(dsn, clock=clock)
    if separator and scheme == "sqlite" and rest.startswith("/") and len(rest) > 1:
        from gpugate.store.sqlite import SqliteStore

        return SqliteStore(rest[1:], clock=clock)
    shown = f"{scheme}://..." if separator else repr(dsn)
    raise StoreError(f"unsupported store DSN {shown}: expected {ACCEPTED_DSNS}")
