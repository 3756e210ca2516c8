"""The push suites: the two-backend ``dsn`` of the job engine's tests, and a fake push worker
speaking the real protocol on a real loopback socket (for the runtime's unit tests)."""

from __future__ import annotations

import sys
from pathlib import Path

from jobs.conftest import dsn, jobs_postgres, jobs_schema

# The e2e rig (e2e/jobs_e2e.py) imports its siblings by name, as tests/e2e's own conftest
# makes possible; the push end-to-end tests use it when tests/push runs alone too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

__all__ = ["dsn", "jobs_postgres", "jobs_schema"]
