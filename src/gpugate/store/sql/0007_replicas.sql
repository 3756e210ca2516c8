-- The gateway processes sharing this store, each heartbeating (DESIGN §5.3, §6). A dispatcher
-- claim names its replica (leased_by = '<slug>-dispatcher@<replica>'), so when a replica falls
-- silent the others take its claims back within a minute instead of waiting out the 600 s
-- dispatcher lease.

CREATE TABLE gateway_replicas (
    id         text   NOT NULL PRIMARY KEY,
    started_at {TIME} NOT NULL,
    last_seen  {TIME} NOT NULL
);
