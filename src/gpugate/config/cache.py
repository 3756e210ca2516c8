"""``cache:`` on an upstream or a runtime: the synchronous job front's result cache, opt in."""

from __future__ import annotations

from pydantic import Field

from gpugate.config.fields import ConfigModel, PositiveSeconds


class CacheConfig(ConfigModel):
    """Keep successful job results of these models for ``ttl_s``, at most ``max_entries`` of
    them per model (least recently used first out), in each replica's memory."""

    ttl_s: PositiveSeconds
    max_entries: int = Field(1024, ge=1)
