"""The identity tests run on both store backends (``dsn``, as in ``tests/jobs``)."""

from __future__ import annotations

from jobs.conftest import dsn, jobs_postgres, jobs_schema

__all__ = ["dsn", "jobs_postgres", "jobs_schema"]
