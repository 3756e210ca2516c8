-- Durable jobs and their audit trail (DESIGN §5). A job is claimed by a dispatcher, then held by
-- a runtime's call; lease_token fences every write of the holder. Every state change appends a
-- job_events row in the same transaction. Timestamps are fixed-width ISO-8601 UTC text.

CREATE TABLE jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    slug             TEXT    NOT NULL UNIQUE,
    idempotency_key  TEXT    UNIQUE,
    model            TEXT    NOT NULL,
    class            TEXT    NOT NULL CHECK (class IN ('system', 'interactive', 'batch')),
    operation        TEXT    NOT NULL DEFAULT 'chat/completions',
    input            TEXT    NOT NULL DEFAULT '{}',
    input_ref        TEXT,
    runner           TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN (
                         'queued', 'dispatching', 'running', 'completed', 'failed', 'cancelled')),
    attempts         TEXT    NOT NULL DEFAULT '{}',
    submit_count     INTEGER NOT NULL DEFAULT 0 CHECK (submit_count >= 0),
    rescue_count     INTEGER NOT NULL DEFAULT 0 CHECK (rescue_count >= 0),
    leased_by        TEXT,
    lease_token      TEXT,
    lease_expires_at TEXT,
    not_before       TEXT,
    allow_external   INTEGER NOT NULL DEFAULT 1 CHECK (allow_external IN (0, 1)),
    result           TEXT,
    result_ref       TEXT,
    error_code       TEXT,
    error_message    TEXT,
    cost_cents       REAL,
    created_at       TEXT    NOT NULL,
    updated_at       TEXT    NOT NULL,
    finished_at      TEXT
);

-- The claim, in its order (id, oldest first): composite, not partial, since a partial index made
-- SQLite scan the table on every claim (job-store lessons §3). Keyed (state, not_before, id)
-- instead, each claim sorted every queued job (0.12 against 0.009 ms with 100,000 finished and
-- 1,000 queued jobs), and after ANALYZE SQLite scanned the whole table (9.6 ms).
CREATE INDEX jobs_claim ON jobs (state, id);
-- The reaper's expired leases.
CREATE INDEX jobs_lease ON jobs (lease_expires_at);
-- The console's queue depth per runtime.
CREATE INDEX jobs_runner_state ON jobs (runner, state);

CREATE TABLE job_events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id     INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    at         TEXT    NOT NULL,
    status     TEXT    NOT NULL CHECK (status IN (
                   'queued', 'dispatching', 'submitted', 'running', 'progress', 'completed',
                   'failed', 'cancelled', 'deferred', 'released', 'rescued', 'retried', 'walked')),
    actor      TEXT    NOT NULL,
    runtime    TEXT,
    call_id    TEXT,
    error_code TEXT,
    detail     TEXT    NOT NULL DEFAULT '{}'
);

CREATE INDEX job_events_job_id ON job_events (job_id, id);
