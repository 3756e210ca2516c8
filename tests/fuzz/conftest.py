"""The fuzz runs against the strictest store at hand: PostgreSQL when GPUGATE_TEST_POSTGRES
names one (it refuses text SQLite would keep), else SQLite — once, to stay within CI's time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobs.conftest import POSTGRES_ENV, jobs_postgres, jobs_schema

__all__ = ["fuzz_dsn", "jobs_postgres", "jobs_schema"]


@pytest.fixture
def fuzz_dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if os.environ.get(POSTGRES_ENV):
        schema_dsn: str = request.getfixturevalue("jobs_schema")
        return schema_dsn
    return f"sqlite:///{tmp_path / 'gpugate.db'}"
