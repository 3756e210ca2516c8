"""The web tests that store what a client sent run on both backends (``dsn``, as in
``tests/jobs``): the same input must be accepted or refused identically on each."""

from __future__ import annotations

from jobs.conftest import dsn, jobs_postgres, jobs_schema

__all__ = ["dsn", "jobs_postgres", "jobs_schema"]
