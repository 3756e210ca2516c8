-- Usage per client key, model and upstream per UTC day (issue #16): what /admin/usage and the
-- console's usage page read. Rows are bounded by keys x models x upstreams x days.

CREATE TABLE key_usage (
    day               TEXT    NOT NULL,
    key_id            TEXT    NOT NULL,
    tenant            TEXT    NOT NULL,
    model             TEXT    NOT NULL,
    upstream          TEXT    NOT NULL,
    requests          INTEGER NOT NULL DEFAULT 0,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    cents             REAL    NOT NULL DEFAULT 0,
    PRIMARY KEY (day, key_id, model, upstream)
);
CREATE INDEX key_usage_tenant ON key_usage (tenant, day);
