"""The job engine's tests run on both store backends: ``dsn`` is a SQLite file or a fresh
PostgreSQL schema (``GPUGATE_TEST_POSTGRES``; probed at the local default when unset, and the
PostgreSQL cases skipped if nothing answers), as in ``tests/store``."""

from __future__ import annotations

import os
import secrets
from typing import TYPE_CHECKING
from urllib.parse import quote

import psycopg
import pytest

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

POSTGRES_ENV = "GPUGATE_TEST_POSTGRES"
LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def jobs_postgres() -> str:
    """The PostgreSQL server of this session, probed once."""
    required = os.environ.get(POSTGRES_ENV)
    dsn = required or LOCAL_POSTGRES
    try:
        with psycopg.connect(dsn, connect_timeout=3):
            pass
    except psycopg.OperationalError as exc:
        if required:
            pytest.fail(f"{POSTGRES_ENV} is set but PostgreSQL is not reachable: {exc}")
        pytest.skip(f"PostgreSQL not reachable at {LOCAL_POSTGRES}; set {POSTGRES_ENV}")
    return dsn


@pytest.fixture
async def jobs_schema(jobs_postgres: str) -> AsyncIterator[str]:
    """A DSN on a fresh schema of the session's PostgreSQL, dropped afterwards."""
    schema = f"gj_{secrets.token_hex(6)}"
    async with await psycopg.AsyncConnection.connect(jobs_postgres, autocommit=True) as conn:
        await conn.execute(f"CREATE SCHEMA {schema}")
    joiner = "&" if "?" in jobs_postgres else "?"
    try:
        yield f"{jobs_postgres}{joiner}options={quote(f'-csearch_path={schema}', safe='')}"
    finally:
        async with await psycopg.AsyncConnection.connect(jobs_postgres, autocommit=True) as conn:
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the test's store lives, once per backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gpugate.db'}"
    schema_dsn: str = request.getfixturevalue("jobs_schema")
    return schema_dsn
