-- Config versions and the audit trail. Timestamps are ISO-8601 UTC text of fixed width, so
-- they compare as strings; JSON is text.

CREATE TABLE config_versions (
    version    INTEGER PRIMARY KEY,
    document   TEXT    NOT NULL,
    created_at TEXT    NOT NULL,
    actor      TEXT    NOT NULL,
    note       TEXT    NOT NULL DEFAULT ''
);

CREATE TABLE audit_events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      TEXT    NOT NULL,
    actor   TEXT    NOT NULL,
    action  TEXT    NOT NULL,
    subject TEXT    NOT NULL,
    detail  TEXT    NOT NULL DEFAULT '{}'
);

CREATE INDEX audit_events_action_id ON audit_events (action, id);
CREATE INDEX audit_events_subject_id ON audit_events (subject, id);
