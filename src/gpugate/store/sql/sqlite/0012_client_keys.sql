-- Client keys (auth.mode: keys; issue #16). Only the SHA-256 of a key's secret is stored, with
-- a short public prefix for display and logs. models / runners: a JSON list, NULL = all.
-- limits: a JSON object of the five limits, each null = unlimited. A revoked key keeps its row
-- (usage and audit name it); revoked_at set means it no longer authenticates.

CREATE TABLE client_keys (
    id             TEXT    NOT NULL PRIMARY KEY,
    name           TEXT    NOT NULL,
    tenant         TEXT    NOT NULL,
    prefix         TEXT    NOT NULL,
    digest         TEXT    NOT NULL UNIQUE,
    models         TEXT,
    max_class      TEXT    NOT NULL CHECK (max_class IN ('system', 'interactive', 'batch')),
    runners        TEXT,
    allow_external INTEGER NOT NULL DEFAULT 0,
    limits         TEXT    NOT NULL DEFAULT '{}',
    expires_at     TEXT,
    created_at     TEXT    NOT NULL,
    updated_at     TEXT    NOT NULL,
    revoked_at     TEXT
);

CREATE INDEX client_keys_tenant ON client_keys (tenant, created_at);
