-- Idempotency records of the sync proxy: one row per Idempotency-Key, claimed by an owner while
-- in flight, then holding the response to replay until expires_at.

CREATE TABLE idempotency (
    key         text        PRIMARY KEY,
    fingerprint text        NOT NULL,
    state       text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
    status      integer,
    headers     jsonb,
    body        bytea,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    owner       text        NOT NULL
);

CREATE INDEX idempotency_expires_at ON idempotency (expires_at);
