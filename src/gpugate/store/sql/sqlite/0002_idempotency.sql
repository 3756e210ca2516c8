-- Idempotency records of the sync proxy: one row per Idempotency-Key, claimed by an owner while
-- in flight, then holding the response to replay until expires_at.

CREATE TABLE idempotency (
    key         TEXT    PRIMARY KEY,
    fingerprint TEXT    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed')),
    status      INTEGER,
    headers     TEXT,
    body        BLOB,
    created_at  TEXT    NOT NULL,
    expires_at  TEXT    NOT NULL,
    owner       TEXT    NOT NULL
);

CREATE INDEX idempotency_expires_at ON idempotency (expires_at);
