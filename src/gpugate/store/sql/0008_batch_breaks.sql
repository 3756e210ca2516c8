-- A poison batch no longer retries forever (issue 14 defect 9): each time a run breaks, the
-- runner counts it and keeps the reason; a batch that broke batches.max_breaks times fails with
-- that reason instead of being resumed again. Existing rows: no break yet, no error.

ALTER TABLE batches ADD COLUMN breaks integer NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN error text;
