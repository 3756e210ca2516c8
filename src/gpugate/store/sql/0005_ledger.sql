-- The spend ledger (DESIGN §5 Guardrails): one entry per call to a runtime with a budget. At
-- dispatch the estimated cost is reserved (state 'reserved', source 'estimated') in the same
-- statement that checks today's spend; when the call ends it is settled ('settled': the cost
-- the runtime reported, source 'reported', or duration x cents_per_second, 'estimated') or
-- released ('released', 0 cents: the submit failed or the call was lost). lease_token ties an
-- entry to the lease it was reserved under: once the job no longer holds it, the call is over.

CREATE TABLE ledger (
    id               {ID},
    runtime          text   NOT NULL,
    day              {DATE} NOT NULL,
    slug             text   NOT NULL,
    lease_token      text   NOT NULL,
    call_id          text,
    cents            {REAL} NOT NULL CHECK (cents >= 0),
    estimated_cents  {REAL} NOT NULL CHECK (estimated_cents >= 0),
    cents_per_second {REAL} NOT NULL CHECK (cents_per_second >= 0),
    source           text   NOT NULL CHECK (source IN ('estimated', 'reported')),
    state            text   NOT NULL CHECK (state IN ('reserved', 'settled', 'released')),
    at               {TIME} NOT NULL,
    settled_at       {TIME}
);

-- The settlement sweep reads the open reservations only.
-- if postgres
CREATE INDEX ledger_reserved ON ledger (id) WHERE state = 'reserved';
-- if sqlite
CREATE INDEX ledger_state ON ledger (state, id);
-- end
-- A runtime's recent entries (GET /admin/runtimes/{id}).
CREATE INDEX ledger_runtime ON ledger (runtime, id);
-- A job's entries (settling the latest one of a completed job).
CREATE INDEX ledger_slug ON ledger (slug, runtime, id);

-- Each runtime's spend per UTC day: reservations plus settled costs. The reservation is one
-- conditional upsert of this row (INSERT ... ON CONFLICT DO UPDATE ... WHERE cents < limit):
-- concurrent reservations, from any replica, serialise on the row's lock (on SQLite, on its
-- single writer) and each re-checks the limit against the committed total, so there is no
-- check-then-act window.
-- soft_cap_at: when this day's spend first reached daily_cents (the soft-cap alert, once a day).
CREATE TABLE spend_days (
    runtime     text   NOT NULL,
    day         {DATE} NOT NULL,
    cents       {REAL} NOT NULL DEFAULT 0,
    soft_cap_at {TIME},
    PRIMARY KEY (runtime, day)
);
