-- The counters behind a client key's limits, shared by every replica (issue #16). One row per
-- key and span: 'm:<UTC minute>' (requests, tokens), 'd:<UTC day>' (tokens, cents) and 'c'
-- (requests in flight). A reservation locks the key's row in client_keys (FOR UPDATE; on
-- SQLite, the single writer), reads these, checks every limit and adds its estimate in one
-- transaction, so concurrent reservations from any replica serialise and none acts on a stale
-- count; the end of the request replaces the estimate with the real usage, a failure gives it
-- back. Old windows are purged.

CREATE TABLE key_counters (
    key_id   text     NOT NULL,
    span     text     NOT NULL,
    requests {BIGINT} NOT NULL DEFAULT 0,
    tokens   {BIGINT} NOT NULL DEFAULT 0,
    cents    {REAL}   NOT NULL DEFAULT 0,
    at       {TIME}   NOT NULL,
    PRIMARY KEY (key_id, span)
);
CREATE INDEX key_counters_at ON key_counters (at);
