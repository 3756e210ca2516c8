"""``auth``: who may call the data plane and the job routes (DESIGN §2a, issue #16).

A process key. ``mode: open`` (the default) keeps the gateway as it always was: no client
identity, anyone who reaches ``listen`` may call it (a demo or a single user behind a firewall).
``mode: keys``: every data-plane and job route needs a client key (``Authorization: Bearer``,
``api-key`` or ``x-api-key``), created with ``gpugate keys create`` or ``POST /admin/keys``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpugate.config.fields import ConfigModel, EnvName, PositiveSeconds


class AuthConfig(ConfigModel):
    """Client identity on the data plane and the job routes."""

    mode: Literal["open", "keys"] = "open"
    bootstrap_keys_env: EnvName | None = None
    key_cache_s: PositiveSeconds = 2.0  # a key looked up is trusted this long: revocation delay
    usage_flush_s: PositiveSeconds = 1.0  # how often a replica writes its usage counts
    key_label: bool = False  # gateway_tokens_total also carries the key's prefix (unbounded!)
    max_keys_cached: int = Field(10000, ge=1)
