-- Durable jobs and their audit trail (DESIGN §5). A job is claimed by a dispatcher, then held by
-- a runtime's call; lease_token fences every write of the holder. Every state change appends a
-- job_events row in the same transaction.

CREATE TABLE jobs (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    slug             text        NOT NULL UNIQUE,
    idempotency_key  text        UNIQUE,
    model            text        NOT NULL,
    class            text        NOT NULL CHECK (class IN ('system', 'interactive', 'batch')),
    operation        text        NOT NULL DEFAULT 'chat/completions',
    input            jsonb       NOT NULL DEFAULT '{}',
    input_ref        text,
    runner           text        NOT NULL,
    state            text        NOT NULL CHECK (state IN (
                         'queued', 'dispatching', 'running', 'completed', 'failed', 'cancelled')),
    attempts         jsonb       NOT NULL DEFAULT '{}',
    submit_count     integer     NOT NULL DEFAULT 0 CHECK (submit_count >= 0),
    rescue_count     integer     NOT NULL DEFAULT 0 CHECK (rescue_count >= 0),
    leased_by        text,
    lease_token      text,
    lease_expires_at timestamptz,
    not_before       timestamptz,
    allow_external   boolean     NOT NULL DEFAULT true,
    result           jsonb,
    result_ref       text,
    error_code       text,
    error_message    text,
    cost_cents       double precision,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    finished_at      timestamptz
);

-- The claim: queued jobs only (the index stays as small as the queue), in the claim order (id,
-- oldest first) so that ORDER BY id LIMIT k reads k entries. Keyed (not_before, id) instead, the
-- planner walked the primary key through every finished job: 8.6 ms against 0.26 ms per claim
-- with 100,000 finished and 1,000 queued jobs. not_before rides along for the filter.
CREATE INDEX jobs_claim ON jobs (id) INCLUDE (not_before) WHERE state = 'queued';
-- The reaper's expired leases and the max_concurrency count: leased jobs only.
CREATE INDEX jobs_lease ON jobs (lease_expires_at) WHERE lease_expires_at IS NOT NULL;
-- The console's queue depth per runtime.
CREATE INDEX jobs_runner_state ON jobs (runner, state);

CREATE TABLE job_events (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint      NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    at         timestamptz NOT NULL,
    status     text        NOT NULL CHECK (status IN (
                   'queued', 'dispatching', 'submitted', 'running', 'progress', 'completed',
                   'failed', 'cancelled', 'deferred', 'released', 'rescued', 'retried', 'walked')),
    actor      text        NOT NULL,
    runtime    text,
    call_id    text,
    error_code text,
    detail     jsonb       NOT NULL DEFAULT '{}'
);

CREATE INDEX job_events_job_id ON job_events (job_id, id);
