-- Client keys (auth.mode: keys; issue #16). Only the SHA-256 of a key's secret is stored, with
-- a short public prefix for display and logs. models / runners: a JSON list, NULL = all.
-- limits: a JSON object of the five limits, each null = unlimited. A revoked key keeps its row
-- (usage and audit name it); revoked_at set means it no longer authenticates.

CREATE TABLE client_keys (
    id             text   NOT NULL PRIMARY KEY,
    name           text   NOT NULL,
    tenant         text   NOT NULL,
    prefix         text   NOT NULL,
    digest         text   NOT NULL UNIQUE,
    models         {JSON},
    max_class      text   NOT NULL CHECK (max_class IN ('system', 'interactive', 'batch')),
    runners        {JSON},
    allow_external {BOOL} NOT NULL DEFAULT {FALSE},
    limits         {JSON} NOT NULL DEFAULT '{}',
    expires_at     {TIME},
    created_at     {TIME} NOT NULL,
    updated_at     {TIME} NOT NULL,
    revoked_at     {TIME}
);

CREATE INDEX client_keys_tenant ON client_keys (tenant, created_at);
