"""The push suites: the two-backend ``dsn`` of the job engine's tests, and a fake push worker
speaking the real protocol on a real loopback socket (for the runtime's unit tests)."""

from __future__ import annotations

from jobs.conftest import dsn, jobs_postgres, jobs_schema

__all__ = ["dsn", "jobs_postgres", "jobs_schema"]
