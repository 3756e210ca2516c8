-- Idempotency records of the sync proxy: one row per Idempotency-Key, claimed by an owner while
-- in flight, then holding the response to replay until expires_at.

CREATE TABLE idempotency (
    key         text    PRIMARY KEY,
    fingerprint text    NOT NULL,
    state       text    NOT NULL CHECK (state IN ('in_flight', 'completed')),
    status      integer,
    headers     {JSON},
    body        {BYTES},
    created_at  {TIME}  NOT NULL,
    expires_at  {TIME}  NOT NULL,
    owner       text    NOT NULL
);

CREATE INDEX idempotency_expires_at ON idempotency (expires_at);
