-- Which tenant owns a job, a Batch API batch or file (issue #16): kind 'job' | 'batch' | 'file'
-- and its id (slug, batch id, file id). With auth.mode: keys every job route, batch and file
-- route looks here; a thing another tenant owns is answered 404. Rows are written when the
-- thing is created and go with it (purged with the jobs).

CREATE TABLE tenancy (
    kind   text NOT NULL CHECK (kind IN ('job', 'batch', 'file')),
    id     text NOT NULL,
    tenant text NOT NULL,
    PRIMARY KEY (kind, id)
);
CREATE INDEX tenancy_tenant ON tenancy (tenant, kind);
