-- The operator state of each runtime (DESIGN §3): enabled, disabled or drained, why, by whom and
-- since when. A runtime without a row is enabled. Every change appends an audit event in the
-- same transaction, so the audit log holds the history (auto-disables included).

CREATE TABLE runtime_states (
    runtime text   PRIMARY KEY,
    state   text   NOT NULL CHECK (state IN ('enabled', 'disabled', 'drained')),
    reason  text   NOT NULL DEFAULT '',
    actor   text   NOT NULL,
    since   {TIME} NOT NULL
);

-- The audit log filtered by actor (GET /admin/audit?actor=...).
CREATE INDEX audit_events_actor_id ON audit_events (actor, id);
-- A runtime's last submit (GET /admin/runtimes/{id}).
CREATE INDEX job_events_runtime_status ON job_events (runtime, status, id);
