"""``models[]``: per-model policy of the synchronous path — which models stand in for a model
that cannot answer (``fallbacks``) and which serve a prompt too long for it
(``context_fallbacks``). A model not listed has neither."""

from __future__ import annotations

from pydantic import Field

from gpugate.config.engine import RoutingConfig
from gpugate.config.fields import ConfigModel, Name


class PriceConfig(ConfigModel):
    """What a model costs through a client key, in cents per 1000 tokens (issue #16)."""

    prompt_per_1k_cents: float = Field(0.0, ge=0)
    completion_per_1k_cents: float = Field(0.0, ge=0)


class ModelConfig(ConfigModel):
    """One model's policy on the data plane."""

    name: Name
    #: Tried in order when every upstream of the model failed the request (after retries), is
    #: out of rotation, or answers 429/5xx.
    fallbacks: list[Name] = Field(default_factory=list)
    #: Tried in order when the model answers 400 ``context_length_exceeded``.
    context_fallbacks: list[Name] = Field(default_factory=list)
    #: Its price per 1000 tokens: usage per client key becomes cost, and daily_cents holds.
    price: PriceConfig | None = None
    #: How its endpoints are chosen (docs/routing.md); an upstream's own ``routing`` wins.
    routing: RoutingConfig | None = None
