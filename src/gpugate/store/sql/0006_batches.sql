-- The OpenAI Batch API façade (issue 9): uploaded files (bytes in the blob store), batches with
-- a runner's lease, and one row per finished line, so a resumed batch re-runs only the rest.
-- JSON is text (never queried).

CREATE TABLE batch_files (
    id         text    PRIMARY KEY,
    purpose    text    NOT NULL,
    filename   text    NOT NULL,
    bytes      integer NOT NULL CHECK (bytes >= 0),
    blob_key   text    NOT NULL,
    created_at {TIME}  NOT NULL
);

CREATE TABLE batches (
    id                text    PRIMARY KEY,
    endpoint          text    NOT NULL,
    input_file_id     text    NOT NULL REFERENCES batch_files (id),
    completion_window text    NOT NULL,
    status            text    NOT NULL CHECK (status IN (
                          'validating', 'failed', 'in_progress', 'finalizing', 'completed',
                          'expired', 'cancelling', 'cancelled')),
    total             integer NOT NULL CHECK (total >= 0),
    completed         integer NOT NULL DEFAULT 0,
    failed            integer NOT NULL DEFAULT 0,
    output_file_id    text,
    error_file_id     text,
    metadata          text,
    owner             text,
    lease_expires_at  {TIME},
    created_at        {TIME}  NOT NULL,
    in_progress_at    {TIME},
    finalizing_at     {TIME},
    completed_at      {TIME},
    failed_at         {TIME},
    cancelling_at     {TIME},
    cancelled_at      {TIME},
    expires_at        {TIME}
);

-- The runner's claim: runnable batches, oldest first.
CREATE INDEX batches_status ON batches (status, created_at);

CREATE TABLE batch_items (
    batch_id  text    NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    line      integer NOT NULL,
    custom_id text    NOT NULL,
    ok        {BOOL}  NOT NULL{sqlite: CHECK (ok IN (0, 1))},
    output    text    NOT NULL,
    PRIMARY KEY (batch_id, line)
);
