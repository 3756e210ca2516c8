"""The job benchmark's baseline: the same job lifecycle in bare SQL, no gateway in between.

One connection, like the job-store lessons measured it: N one-row inserts (a transaction each),
then claims of ``CLAIM_BATCH`` jobs per statement with a lease and a token (a CTE over
``FOR UPDATE SKIP LOCKED`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), and one fenced
``complete`` per job that stores the canned chat completion as its result. PostgreSQL through
psycopg 3, SQLite through sqlite3 in WAL mode with ``synchronous=NORMAL``. Its own table
(``bare_jobs``), so it never touches the gateway's.
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from proxy_targets import BenchError, chat_completion

CLAIM_BATCH = 10
PAYLOAD = '{"messages":[{"role":"user","content":"Say hello"}],"max_tokens":16}'

PG_SCHEMA = """
CREATE TABLE bare_jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state text NOT NULL, payload jsonb NOT NULL, result jsonb,
    lease_token text, lease_expires_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(), finished_at timestamptz);
CREATE INDEX bare_jobs_claim ON bare_jobs (id) WHERE state = 'queued';
CREATE INDEX bare_jobs_lease ON bare_jobs (lease_expires_at) WHERE state = 'running'"""
PG_INSERT = "INSERT INTO bare_jobs (state, payload) VALUES ('queued', %s)"
PG_CLAIM = """
WITH c AS (SELECT id FROM bare_jobs WHERE state = 'queued' ORDER BY id LIMIT %s
           FOR UPDATE SKIP LOCKED)
UPDATE bare_jobs j SET state = 'running', lease_token = %s,
    lease_expires_at = now() + interval '600 seconds'
FROM c WHERE j.id = c.id RETURNING j.id"""
PG_COMPLETE = """
UPDATE bare_jobs SET state = 'completed', result = %s, finished_at = now(), lease_token = NULL,
    lease_expires_at = NULL
WHERE id = %s AND lease_token = %s AND state = 'running'"""

SQLITE_SCHEMA = """
CREATE TABLE bare_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    state TEXT NOT NULL, payload TEXT NOT NULL, result TEXT,
    lease_token TEXT, lease_expires_at TEXT,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f', 'now')), finished_at TEXT);
CREATE INDEX bare_jobs_claim ON bare_jobs (state, id);
CREATE INDEX bare_jobs_lease ON bare_jobs (lease_expires_at)"""
SQLITE_INSERT = "INSERT INTO bare_jobs (state, payload) VALUES ('queued', ?)"
SQLITE_CLAIM = """
UPDATE bare_jobs SET state = 'running', lease_token = ?,
    lease_expires_at = strftime('%Y-%m-%dT%H:%M:%f', 'now', '+600 seconds')
WHERE id IN (SELECT id FROM bare_jobs WHERE state = 'queued' ORDER BY id LIMIT ?)
RETURNING id"""
SQLITE_COMPLETE = """
UPDATE bare_jobs SET state = 'completed', result = ?, lease_token = NULL, lease_expires_at = NULL,
    finished_at = strftime('%Y-%m-%dT%H:%M:%f', 'now')
WHERE id = ? AND lease_token = ? AND state = 'running'"""


@dataclass(frozen=True)
class Bare:
    """One bare lifecycle run: N jobs, the seconds of each half."""

    jobs: int
    insert_s: float
    claim_complete_s: float

    @property
    def insert_rate(self) -> float:
        return self.jobs / self.insert_s

    @property
    def claim_complete_rate(self) -> float:
        return self.jobs / self.claim_complete_s

    @property
    def rate(self) -> float:
        """Jobs per second through the whole lifecycle (insert + claim + complete)."""
        return self.jobs / (self.insert_s + self.claim_complete_s)


# A claim: (token) -> claimed ids; a completion: (id, token) -> rows changed.
Claim = Callable[[str], Sequence[int]]
Complete = Callable[[int, str], int]


def _lifecycle(jobs: int, insert: Callable[[], object], claim: Claim, complete: Complete) -> Bare:
    """Time N inserts, then claims of CLAIM_BATCH and a fenced completion per job."""
    start = time.perf_counter()
    for _ in range(jobs):
        insert()
    inserted = time.perf_counter()
    done = 0
    while True:
        token = secrets.token_urlsafe(16)
        ids = claim(token)
        if not ids:
            break
        done += sum(complete(job_id, token) for job_id in ids)
    finished = time.perf_counter()
    if done != jobs:
        raise BenchError(f"the bare loop completed {done} of {jobs} jobs")
    return Bare(jobs, inserted - start, finished - inserted)


def bare_postgres(dsn: str, jobs: int) -> Bare:
    """The lifecycle on PostgreSQL (in the schema the DSN's search_path names)."""
    result = chat_completion().decode()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(PG_SCHEMA)

        def claim(token: str) -> list[int]:
            return [row[0] for row in conn.execute(PG_CLAIM, (CLAIM_BATCH, token)).fetchall()]

        def complete(job_id: int, token: str) -> int:
            return conn.execute(PG_COMPLETE, (result, job_id, token)).rowcount

        return _lifecycle(jobs, lambda: conn.execute(PG_INSERT, (PAYLOAD,)), claim, complete)


def bare_sqlite(path: Path, jobs: int) -> Bare:
    """The lifecycle on SQLite (WAL, synchronous=NORMAL) in its own file."""
    result = chat_completion().decode()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.executescript(SQLITE_SCHEMA)

        def claim(token: str) -> list[int]:
            conn.execute("BEGIN IMMEDIATE")
            rows = conn.execute(SQLITE_CLAIM, (token, CLAIM_BATCH)).fetchall()
            conn.execute("COMMIT")
            return [row[0] for row in rows]

        def complete(job_id: int, token: str) -> int:
            return conn.execute(SQLITE_COMPLETE, (result, job_id, token)).rowcount

        return _lifecycle(jobs, lambda: conn.execute(SQLITE_INSERT, (PAYLOAD,)), claim, complete)
    finally:
        conn.close()
