"""``upstreams[]``: the model servers the gateway forwards HTTP to."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from gpugate.config.cache import CacheConfig
from gpugate.config.engine import EngineConfig, RoutingConfig
from gpugate.config.fields import (
    ConfigModel,
    EnvName,
    GpuId,
    HttpUrl,
    Identifier,
    Name,
    PositiveSeconds,
    Seconds,
    UrlPath,
)

RawMethod = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _get_and_post() -> list[RawMethod]:
    return ["GET", "POST"]


class RawConfig(ConfigModel):
    """``upstreams[].raw``: what ``/u/{upstream}/{path}`` may forward to an ``azure-di``,
    ``external`` or keyed upstream (none of them is reachable through ``/u/`` without it), and
    to any other upstream that has the block (without it: every method and path)."""

    methods: list[RawMethod] = Field(default_factory=_get_and_post, min_length=1)
    path_prefixes: list[UrlPath] = Field(default_factory=lambda: ["/v1/"], min_length=1)
    send_key: bool = False


class RetryConfig(ConfigModel):
    """How often and how patiently the sync path tries this upstream again (DESIGN §2a).

    ``attempts`` counts tries (1 = no retry). A retry waits ``Retry-After`` when the upstream
    sent one and it is at most ``retry_after_max_s``, else a full-jitter exponential backoff
    starting at ``backoff_s`` and capped at ``max_backoff_s``.
    """

    attempts: int = Field(3, ge=1, le=10)
    backoff_s: Seconds = 0.5
    max_backoff_s: Seconds = 4.0
    retry_after_max_s: Seconds = 10.0

    @model_validator(mode="after")
    def _ordered(self) -> RetryConfig:
        if self.max_backoff_s < self.backoff_s:
            raise ValueError("max_backoff_s must be at least backoff_s")
        return self


class UpstreamConfig(ConfigModel):
    """One model server: its endpoint URLs, the models it serves, the GPUs it runs on.

    Exactly one of ``url`` and ``urls``, unique ``models`` and the form of ``gpu_ids`` are
    checked with the cross-field rules (:mod:`.rules`), so they are reported even when another
    key of the same upstream is wrong.
    """

    id: Identifier
    url: HttpUrl | None = None
    urls: Annotated[list[HttpUrl], Field(min_length=1)] | None = None
    models: list[Name] = Field(min_length=1)
    gpu_ids: list[GpuId] = Field(default_factory=list)
    max_inflight: int = Field(64, ge=1)
    queue_timeout_s: PositiveSeconds = 30.0
    timeout_s: PositiveSeconds = 300.0
    external: bool = False
    max_queue: int = Field(1024, ge=0)
    connect_timeout_s: PositiveSeconds = 5.0
    #: Non-streaming: send → response headers (null: ``timeout_s``). A silent provider holds a
    #: request this long per try; see docs/dataplane.md for why 45 s.
    first_byte_timeout_s: PositiveSeconds | None = 45.0
    #: Streaming: send → the first SSE data event; the client's headers are held until then.
    first_token_timeout_s: PositiveSeconds = 30.0
    #: Streaming: the longest silence between two events once the stream has begun.
    stream_idle_timeout_s: PositiveSeconds = 30.0
    retry: RetryConfig = RetryConfig()
    #: How a stream broken after bytes reached the client may be continued *on this upstream*:
    #: ``prefill`` (it accepts the delivered text as a trailing assistant message), ``replay``
    #: (the same request again, output suppressed until it has passed the delivered text byte
    #: for byte; only for a deterministic request), or ``none``.
    continuation: Literal["prefill", "replay", "none"] = "replay"
    health_path: UrlPath = "/health"
    api_key_env: EnvName | None = None
    #: ``openai``: an OpenAI-compatible model server (the data plane and jobs route to it).
    #: ``azure-di``: an Azure Document Intelligence resource, reached only through
    #: ``/azure-di/...``; its ``models`` are DI model ids, it is ``external`` by nature and
    #: its key (``api_key_env``) goes in ``Ocp-Apim-Subscription-Key``.
    kind: Literal["openai", "azure-di"] = "openai"
    cache: CacheConfig | None = None
    raw: RawConfig | None = None
    #: The model server's own metrics (queue, KV cache, prefix hits, LoRA); null: not scraped.
    engine: EngineConfig | None = None
    #: How endpoints of this upstream are chosen; null: the model's ``routing``, else defaults.
    routing: RoutingConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _azure_di_is_external(cls, data: Any) -> Any:
        """An ``azure-di`` upstream is a third-party service: ``external`` unless said
        otherwise (saying otherwise is a rule finding)."""
        if isinstance(data, dict) and data.get("kind") == "azure-di" and "external" not in data:
            return {**data, "external": True}
        return data

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The endpoint base URLs, without a trailing slash."""
        urls = self.urls if self.urls is not None else [self.url] if self.url else []
        return tuple(url.rstrip("/") for url in urls)

    @property
    def effective_first_byte_timeout_s(self) -> float:
        """How long to wait for the first byte: ``first_byte_timeout_s``, else ``timeout_s``."""
        if self.first_byte_timeout_s is None:
            return self.timeout_s
        return self.first_byte_timeout_s
