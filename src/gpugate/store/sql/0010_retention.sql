-- issue #15 finding 4: the retention purge finds finished jobs by when they finished, oldest
-- first, without scanning the jobs still running (a partial index: only finished rows).
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
