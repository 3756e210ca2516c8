"""The security suites: the two-backend ``dsn`` of the job engine's tests (a SQLite file, or a
fresh PostgreSQL schema), as in ``tests/push``."""

from __future__ import annotations

from jobs.conftest import dsn, jobs_postgres, jobs_schema

__all__ = ["dsn", "jobs_postgres", "jobs_schema"]
