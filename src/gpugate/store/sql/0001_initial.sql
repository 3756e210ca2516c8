-- Config versions and the audit trail.

CREATE TABLE config_versions (
    version    integer PRIMARY KEY,
    document   {JSON}  NOT NULL,
    created_at {TIME}  NOT NULL,
    actor      text    NOT NULL,
    note       text    NOT NULL DEFAULT ''
);

CREATE TABLE audit_events (
    id      {ID},
    at      {TIME} NOT NULL,
    actor   text   NOT NULL,
    action  text   NOT NULL,
    subject text   NOT NULL,
    detail  {JSON} NOT NULL DEFAULT '{}'
);

CREATE INDEX audit_events_action_id ON audit_events (action, id);
CREATE INDEX audit_events_subject_id ON audit_events (subject, id);
