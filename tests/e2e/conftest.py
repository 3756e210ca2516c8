"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from urllib.parse import quote

import psycopg
import pytest

from e2e.children import kill_leftovers

POSTGRES_ENV = "GPUGATE_TEST_POSTGRES"
LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture
async def postgres_schema() -> AsyncIterator[str]:
    """A DSN on a fresh schema of the test PostgreSQL, dropped afterwards.

    ``GPUGATE_TEST_POSTGRES`` set: PostgreSQL is required (unreachable fails the test); unset:
    the local default is probed and the test skipped if nothing answers.
    """
    required = os.environ.get(POSTGRES_ENV)
    server = required or LOCAL_POSTGRES
    try:
        conn = await psycopg.AsyncConnection.connect(server, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        if required:
            pytest.fail(f"{POSTGRES_ENV} is set but PostgreSQL is not reachable: {exc}")
        pytest.skip(f"PostgreSQL not reachable at {LOCAL_POSTGRES}; set {POSTGRES_ENV}")
    schema = f"gd_{secrets.token_hex(6)}"
    async with conn:
        await conn.execute(f"CREATE SCHEMA {schema}")
    joiner = "&" if "?" in server else "?"
    try:
        yield f"{server}{joiner}options={quote(f'-csearch_path={schema}', safe='')}"
    finally:
        async with await psycopg.AsyncConnection.connect(server, autocommit=True) as conn:
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test() -> Iterator[None]:
    """Kill the ``gpugate serve``/nginx processes a test left running (a timeout, a failure
    before its clean-up): leftovers hold ports and PostgreSQL connections for the whole run."""
    yield
    killed = kill_leftovers()
    if killed:
        print(f"killed processes the test left running: {killed}")
