"""``runtimes[]``: the places a job can run, one model per ``kind``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from gpugate.config.cache import CacheConfig
from gpugate.config.fields import (
    ConfigModel,
    EnvName,
    HttpUrl,
    Identifier,
    Name,
    Seconds,
)

RUNTIME_KINDS = ("upstream", "push", "modal")


class BudgetConfig(ConfigModel):
    """A runtime's daily spend guard: over budget at 2x ``daily_cents`` spent today (UTC), the
    soft-cap alert at 1x. Each call reserves ``cents_per_second x estimate_s`` at dispatch and
    is settled at the cost it reports (or its duration x ``cents_per_second``) when it ends."""

    daily_cents: float = Field(ge=0)
    cents_per_second: float = Field(ge=0)
    estimate_s: Seconds = 60.0

    @property
    def estimate_cents(self) -> float:
        """What one call reserves at dispatch."""
        return self.cents_per_second * self.estimate_s


class PushConfig(ConfigModel):
    """Where a push worker listens, and the variable holding the secret it shares with us.

    ``auth: signed`` (the default): every message is HMAC-signed with keys derived from the
    secret, both ways, and the secret itself never travels; ``bearer``: the compatibility mode
    for a worker that only speaks the wave-1 protocol (the secret as a bearer token, answers not
    authenticated; docs/security.md). ``ca_file``: the CA bundle that signed an ``https://``
    worker's certificate (else the system's CAs).
    """

    url: HttpUrl
    secret_env: EnvName
    auth: Literal["signed", "bearer"] = "signed"
    ca_file: Name | None = None


class ModalConfig(ConfigModel):
    """Which Modal function runs the jobs, and the variables holding the Modal token."""

    app: Name
    function: Name
    environment: Name | None = None
    token_id_env: EnvName = "MODAL_TOKEN_ID"  # noqa: S105 - a variable's name, not a secret
    token_secret_env: EnvName = "MODAL_TOKEN_SECRET"  # noqa: S105 - ditto


class _RuntimeBase(ConfigModel):
    id: Identifier
    kind: str  # narrowed to one literal by each kind; declared here to come second in a dump
    models: list[Name] = Field(default_factory=list)
    enabled: bool = True
    cache: CacheConfig | None = None  # the sync job front's result cache for these models


class UpstreamRuntimeConfig(_RuntimeBase):
    """Jobs forwarded through the gateway's own upstreams; no ``models`` = every upstream model."""

    kind: Literal["upstream"] = "upstream"
    max_concurrency: int | None = Field(None, ge=1)
    budget: BudgetConfig | None = None


class PushRuntimeConfig(_RuntimeBase):
    """A home or local machine running the push worker; serves only the ``models`` listed."""

    kind: Literal["push"] = "push"
    push: PushConfig
    max_concurrency: int = Field(2, ge=1)
    budget: BudgetConfig | None = BudgetConfig(daily_cents=1000, cents_per_second=0.02)


class ModalRuntimeConfig(_RuntimeBase):
    """A serverless Modal function; serves only the ``models`` listed."""

    kind: Literal["modal"] = "modal"
    modal: ModalConfig
    max_concurrency: int = Field(2, ge=1)
    idle_exit_s: Seconds = 60.0
    budget: BudgetConfig | None = BudgetConfig(daily_cents=1000, cents_per_second=0.05)


RuntimeConfig = Annotated[
    UpstreamRuntimeConfig | PushRuntimeConfig | ModalRuntimeConfig,
    Field(discriminator="kind"),
]
