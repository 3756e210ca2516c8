"""``retention``: how long finished rows are kept before the purge loop deletes them
(issue #15 finding 4; ``services/retention.py``)."""

from __future__ import annotations

from pydantic import Field

from gpugate.config.fields import ConfigModel, PositiveSeconds

DAY_S = 86400.0


class RetentionConfig(ConfigModel):
    """Finished jobs (with their events and blobs), audit events, finished batches (with their
    lines and files) older than these are purged; idempotency rows go at their own TTL."""

    jobs_s: PositiveSeconds = 30 * DAY_S
    audit_s: PositiveSeconds = 90 * DAY_S
    batches_s: PositiveSeconds = 30 * DAY_S
    every_s: PositiveSeconds = 300.0
    batch_rows: int = Field(500, ge=1, le=10_000)
