-- The spend ledger (DESIGN §5 Guardrails): one entry per call to a runtime with a budget. At
-- dispatch the estimated cost is reserved (state 'reserved', source 'estimated') in the same
-- transaction that checks today's spend; when the call ends it is settled ('settled': the cost
-- the runtime reported, source 'reported', or duration x cents_per_second, 'estimated') or
-- released ('released', 0 cents: the submit failed or the call was lost). lease_token ties an
-- entry to the lease it was reserved under: once the job no longer holds it, the call is over.
-- Days are UTC dates as text (YYYY-MM-DD).

CREATE TABLE ledger (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    runtime          TEXT    NOT NULL,
    day              TEXT    NOT NULL,
    slug             TEXT    NOT NULL,
    lease_token      TEXT    NOT NULL,
    call_id          TEXT,
    cents            REAL    NOT NULL CHECK (cents >= 0),
    estimated_cents  REAL    NOT NULL CHECK (estimated_cents >= 0),
    cents_per_second REAL    NOT NULL CHECK (cents_per_second >= 0),
    source           TEXT    NOT NULL CHECK (source IN ('estimated', 'reported')),
    state            TEXT    NOT NULL CHECK (state IN ('reserved', 'settled', 'released')),
    at               TEXT    NOT NULL,
    settled_at       TEXT
);

-- The settlement sweep reads the open reservations only.
CREATE INDEX ledger_state ON ledger (state, id);
-- A runtime's recent entries (GET /admin/runtimes/{id}).
CREATE INDEX ledger_runtime ON ledger (runtime, id);
-- A job's entries (settling the latest one of a completed job).
CREATE INDEX ledger_slug ON ledger (slug, runtime, id);

-- Each runtime's spend per UTC day: reservations plus settled costs, kept with every entry's
-- write so that "today's spend + estimate <= 2 x daily_cents" is one conditional upsert.
-- soft_cap_at: when this day's spend first reached daily_cents (the soft-cap alert, once a day).
CREATE TABLE spend_days (
    runtime     TEXT NOT NULL,
    day         TEXT NOT NULL,
    cents       REAL NOT NULL DEFAULT 0,
    soft_cap_at TEXT,
    PRIMARY KEY (runtime, day)
);
