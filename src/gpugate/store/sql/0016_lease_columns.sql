-- issue #17: a job's lease is typed columns instead of the tagged text in leased_by, which
-- Python and SQL parsed: lease_kind (claim | reservation | call), the runtime of a call or a
-- reserved slot, the call's id, the replica of a dispatcher's claim. leased_by stays, written
-- beside them for people and older readers; nothing parses it any more.
ALTER TABLE jobs ADD COLUMN lease_kind text CHECK (lease_kind IN ('claim', 'reservation', 'call'));
ALTER TABLE jobs ADD COLUMN lease_runtime text;
ALTER TABLE jobs ADD COLUMN lease_call_id text;
ALTER TABLE jobs ADD COLUMN lease_replica text;

-- The leases held now, read once from their text: '<slug>-dispatcher@<replica>' (a slug holds
-- no ':'), '<runtime>:~reserved', '<runtime>:<call_id>'.
UPDATE jobs SET lease_kind = 'claim',
    lease_replica = CASE WHEN {STRPOS}(leased_by, '@') > 0
                         THEN substr(leased_by, {STRPOS}(leased_by, '@') + 1) END
WHERE leased_by IS NOT NULL AND {STRPOS}(leased_by, ':') = 0;
UPDATE jobs SET lease_runtime = substr(leased_by, 1, {STRPOS}(leased_by, ':') - 1),
    lease_kind = CASE WHEN substr(leased_by, {STRPOS}(leased_by, ':') + 1) = '~reserved'
                      THEN 'reservation' ELSE 'call' END,
    lease_call_id = CASE WHEN substr(leased_by, {STRPOS}(leased_by, ':') + 1) = '~reserved'
                         THEN NULL ELSE substr(leased_by, {STRPOS}(leased_by, ':') + 1) END
WHERE leased_by IS NOT NULL AND {STRPOS}(leased_by, ':') > 0;

-- if postgres
-- The calls of a runtime in flight (max_concurrency) are counted by it.
CREATE INDEX jobs_lease_runtime ON jobs (lease_runtime) WHERE lease_runtime IS NOT NULL;
-- end
