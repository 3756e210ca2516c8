"""The job benchmark's stores: where each backend's data lives, and what the bench reads there.

SQLite: a fresh file in the run's temporary folder for the gateway, another for the bare loop.
PostgreSQL: a fresh schema on the local server, named in the DSN's ``search_path``, dropped
after the run whatever happens. The bench reads the gateway's tables directly (how many jobs
are completed, whether each ran once) on its own connection — never through the gateway, so
watching does not load what is measured.
"""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import psycopg
from jobs_bare import Bare, bare_postgres, bare_sqlite

BACKENDS = ("sqlite", "postgresql")
PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"

COMPLETED = "SELECT count(*) FROM jobs WHERE state = 'completed'"
BY_STATE = "SELECT state, submit_count, count(*) FROM jobs GROUP BY state, submit_count"
TWICE = """SELECT count(*) FROM (SELECT job_id FROM job_events WHERE status = 'completed'
           GROUP BY job_id HAVING count(*) > 1) AS twice"""
MOMENTS = {  # what happened to the jobs when, by the gateway's clock
    "created": "SELECT created_at FROM jobs",
    "submitted": "SELECT at FROM job_events WHERE status = 'submitted'",
    "completed": "SELECT finished_at FROM jobs WHERE finished_at IS NOT NULL",
}


class Connection(Protocol):
    """What sqlite3's and psycopg's connections both offer."""

    def execute(self, sql: str, /) -> Any: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Target:
    """One backend: the gateway's store DSN, the bare loop, and a connection to read the jobs."""

    backend: str
    dsn: str
    version: str
    bare: Callable[[int], Bare]
    connect: Callable[[], Connection]


def with_search_path(dsn: str, schema: str) -> str:
    """``dsn`` whose connections see ``schema`` first."""
    return f"{dsn}?options={quote(f'-csearch_path={schema}', safe='')}"


def _sqlite_connect(path: Path) -> Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 5000")
    return conn


@contextlib.contextmanager
def store_target(backend: str, workdir: Path) -> Iterator[Target]:
    """The backend's fresh store for one run; a PostgreSQL schema is dropped at the end."""
    if backend == "sqlite":
        db = workdir / "gateway.db"
        yield Target(
            backend,
            f"sqlite:///{db}",
            f"SQLite {sqlite3.sqlite_version}",
            lambda jobs: bare_sqlite(workdir / "bare.db", jobs),
            lambda: _sqlite_connect(db),
        )
        return
    schema = f"gg_bench_{secrets.token_hex(6)}"
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        version = str(admin.execute("SHOW server_version").fetchall()[0][0]).split()[0]
        admin.execute(f"CREATE SCHEMA {schema}")
        try:
            dsn = with_search_path(PG_DSN, schema)
            yield Target(
                backend,
                dsn,
                f"PostgreSQL {version}",
                lambda jobs: bare_postgres(dsn, jobs),
                lambda: psycopg.connect(dsn, autocommit=True),
            )
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


# -- what the bench reads in the gateway's tables -------------------------------------------------


def completed(conn: Connection) -> int:
    return int(conn.execute(COMPLETED).fetchall()[0][0])


def _seconds(value: object) -> float:
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    if not isinstance(moment, datetime):
        raise TypeError(f"not a time: {value!r}")
    return moment.astimezone(UTC).timestamp()


def moments(conn: Connection, since: float) -> dict[str, list[float]]:
    """Each job's creation, submission and completion at or after ``since`` (a Unix time), in
    seconds after it, sorted; the gateway's clock is the bench's (one machine)."""
    out = {}
    for name, sql in MOMENTS.items():
        times = (_seconds(row[0]) - since for row in conn.execute(sql).fetchall())
        out[name] = sorted(t for t in times if t >= 0)
    return out


def problems(conn: Connection, expected: int) -> list[str]:
    """What is wrong with the jobs: not all ``expected`` there, not completed, or not once."""
    found: list[str] = []
    rows = conn.execute(BY_STATE).fetchall()
    total = sum(int(count) for _, _, count in rows)
    if total != expected:
        found.append(f"{total} jobs stored, {expected} created")
    for state, submits, count in rows:
        if state != "completed" or submits != 1:
            found.append(f"{count} jobs {state} with submit_count {submits}")
    twice = int(conn.execute(TWICE).fetchall()[0][0])
    if twice:
        found.append(f"{twice} jobs have more than one 'completed' event")
    return found
