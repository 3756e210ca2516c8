-- Usage per client key, model and upstream per UTC day (issue #16): what /admin/usage and the
-- console's usage page read. Rows are bounded by keys x models x upstreams x days.

CREATE TABLE key_usage (
    day               {DATE}   NOT NULL,
    key_id            text     NOT NULL,
    tenant            text     NOT NULL,
    model             text     NOT NULL,
    upstream          text     NOT NULL,
    requests          {BIGINT} NOT NULL DEFAULT 0,
    prompt_tokens     {BIGINT} NOT NULL DEFAULT 0,
    completion_tokens {BIGINT} NOT NULL DEFAULT 0,
    cents             {REAL}   NOT NULL DEFAULT 0,
    PRIMARY KEY (day, key_id, model, upstream)
);
CREATE INDEX key_usage_tenant ON key_usage (tenant, day);
