-- The OpenAI Batch API façade (issue 9): uploaded files (bytes in the blob store), batches with
-- a runner's lease, and one row per finished line, so a resumed batch re-runs only the rest.
-- Timestamps are fixed-width ISO-8601 UTC text; JSON is text.

CREATE TABLE batch_files (
    id         TEXT    PRIMARY KEY,
    purpose    TEXT    NOT NULL,
    filename   TEXT    NOT NULL,
    bytes      INTEGER NOT NULL CHECK (bytes >= 0),
    blob_key   TEXT    NOT NULL,
    created_at TEXT    NOT NULL
);

CREATE TABLE batches (
    id                TEXT    PRIMARY KEY,
    endpoint          TEXT    NOT NULL,
    input_file_id     TEXT    NOT NULL REFERENCES batch_files (id),
    completion_window TEXT    NOT NULL,
    status            TEXT    NOT NULL CHECK (status IN (
                          'validating', 'failed', 'in_progress', 'finalizing', 'completed',
                          'expired', 'cancelling', 'cancelled')),
    total             INTEGER NOT NULL CHECK (total >= 0),
    completed         INTEGER NOT NULL DEFAULT 0,
    failed            INTEGER NOT NULL DEFAULT 0,
    output_file_id    TEXT,
    error_file_id     TEXT,
    metadata          TEXT,
    owner             TEXT,
    lease_expires_at  TEXT,
    created_at        TEXT    NOT NULL,
    in_progress_at    TEXT,
    finalizing_at     TEXT,
    completed_at      TEXT,
    failed_at         TEXT,
    cancelling_at     TEXT,
    cancelled_at      TEXT,
    expires_at        TEXT
);

-- The runner's claim: runnable batches, oldest first.
CREATE INDEX batches_status ON batches (status, created_at);

CREATE TABLE batch_items (
    batch_id  TEXT    NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    line      INTEGER NOT NULL,
    custom_id TEXT    NOT NULL,
    ok        INTEGER NOT NULL CHECK (ok IN (0, 1)),
    output    TEXT    NOT NULL,
    PRIMARY KEY (batch_id, line)
);
