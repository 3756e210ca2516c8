"""``upstreams[].engine`` (where an upstream's engine metrics are and how often to read them) and
``routing`` (how an endpoint is chosen for a model: on an upstream, or per model in ``models[]``).

The defaults of ``routing`` come from ``bench/routing.py`` (docs/routing.md gives the figures):
``prefix_weight`` is how many queued requests a prompt found in no endpoint's cache is worth,
``balance_abs`` / ``balance_rel`` when load beats affinity outright.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gpugate.config.fields import ConfigModel, PositiveSeconds, UrlPath

EngineKind = Literal["auto", "vllm", "sglang", "tei", "none"]
RoutingPolicyName = Literal["least_outstanding", "engine_load", "prefix_affinity"]


class EngineConfig(ConfigModel):
    """The model server's own metrics, scraped from each endpoint (``url + metrics_path``)."""

    #: ``auto`` reads whichever of vLLM's, SGLang's or TEI's metric names the scrape carries;
    #: ``none`` scrapes nothing (routing then counts gpugate's own outstanding requests only).
    kind: EngineKind = "auto"
    metrics_path: UrlPath = "/metrics"
    poll_s: PositiveSeconds = 2.0
    #: A reading older than this is not used: routing falls back to outstanding counts.
    staleness_s: PositiveSeconds = 10.0
    scrape_timeout_s: PositiveSeconds = 1.0

    @model_validator(mode="after")
    def _stale_after_a_poll(self) -> EngineConfig:
        if self.staleness_s <= self.poll_s:
            raise ValueError("staleness_s must be longer than poll_s")
        return self


class RoutingConfig(ConfigModel):
    """How the endpoint of a request is chosen (docs/routing.md)."""

    #: ``least_outstanding``: power of two choices on gpugate's own count (wave 1).
    #: ``engine_load``: the least loaded by the engine's running and waiting requests and KV use.
    #: ``prefix_affinity``: engine_load plus the approximate prefix index, session and LoRA.
    policy: RoutingPolicyName = "prefix_affinity"
    #: A prompt whose leading blocks are on no endpoint costs as much as this many queued
    #: requests on every endpoint but the one that has them.
    prefix_weight: float = Field(4.0, ge=0)
    #: Each request waiting in the engine (it could not start: slots or KV full) adds this much
    #: on top of counting as outstanding.
    waiting_weight: float = Field(1.0, ge=0)
    #: A KV cache filling from 90 % to 100 % adds up to this much load.
    kv_weight: float = Field(2.0, ge=0)
    #: Affinity (prefix, session, LoRA) is ignored for an endpoint this much busier than the
    #: least loaded one: at least ``balance_abs`` more load AND ``balance_rel`` times as much.
    balance_abs: float = Field(8.0, ge=0)
    balance_rel: float = Field(1.5, ge=1)
    #: The conversation's last endpoint is worth this many queued requests.
    session_weight: float = Field(2.0, ge=0)
    #: An endpoint with the requested LoRA adapter resident is worth this many.
    lora_weight: float = Field(4.0, ge=0)
    #: ``batch`` requests see an endpoint on saturated GPUs as this much busier.
    saturated_penalty: float = Field(4.0, ge=0)
    #: The prefix index hashes the rendered prompt in blocks of this many characters.
    prefix_block_chars: int = Field(256, ge=16, le=65536)
    #: Block hashes remembered per model (least recently used go first): ~60 bytes each.
    prefix_max_blocks: int = Field(200_000, ge=1, le=10_000_000)
    #: Sessions (``X-Session-Id`` or the body's ``user``) remembered, least recently used first.
    max_sessions: int = Field(100_000, ge=0, le=10_000_000)
