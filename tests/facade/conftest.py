"""The façades' tests run their store parts on both backends (``dsn``, as in ``tests/jobs``)."""

from __future__ import annotations

from jobs.conftest import dsn, jobs_postgres, jobs_schema

__all__ = ["dsn", "jobs_postgres", "jobs_schema"]
