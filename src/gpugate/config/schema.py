"""The configuration tree: :class:`GatewayConfig` and its blocks (DESIGN §2, a contract).

The blocks live in their own modules (:mod:`.gpu_health`, :mod:`.upstream`, :mod:`.runtime`)
and are re-exported here. The process keys (``listen``, ``store``, ``admin_token_env``,
``gpu_health``, ``jobs``, ``server``, ``tls``, ``admin_listen``, ``import_env``,
``retention``, ...) come from the file only; the *gateway document*
(``upstreams``, ``runtimes``, ``fallback_chain``, ``default_runtime``, ``stop_conditions``)
lives in the store as versions and is replaced with :meth:`GatewayConfig.with_gateway_document`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Self

from pydantic import Field, PrivateAttr, ValidationInfo, model_validator

from gpugate.config import summary
from gpugate.config.auth import AuthConfig
from gpugate.config.blobs import BlobsConfig, S3Config
from gpugate.config.cache import CacheConfig
from gpugate.config.engine import EngineConfig, RoutingConfig
from gpugate.config.environment import ImportEnvConfig
from gpugate.config.fields import (
    ConfigModel,
    EnvName,
    HttpUrl,
    ListenAddress,
    PositiveSeconds,
    Seconds,
    StoreUrl,
    split_listen,
)
from gpugate.config.gpu_health import ExporterConfig, GpuHealthConfig
from gpugate.config.models import ModelConfig
from gpugate.config.paths import Finding, describe, format_path, quoted_list
from gpugate.config.retention import RetentionConfig
from gpugate.config.rules import IMPLIED_RUNTIME_ID, resolve_implied, rule_findings
from gpugate.config.runtime import (
    BudgetConfig,
    ModalConfig,
    ModalRuntimeConfig,
    PushConfig,
    PushRuntimeConfig,
    RuntimeConfig,
    UpstreamRuntimeConfig,
)
from gpugate.config.source_map import SourceMap
from gpugate.config.telemetry import TelemetryConfig
from gpugate.config.tls import TlsConfig
from gpugate.config.upstream import RetryConfig, UpstreamConfig
from gpugate.config.validation import RULES_CHECKED, validate_document
from gpugate.errors import ConfigError, ConfigProblem

__all__ = [
    "GATEWAY_KEYS",
    "AuthConfig",
    "BlobsConfig",
    "BudgetConfig",
    "CacheConfig",
    "EngineConfig",
    "ExporterConfig",
    "GatewayConfig",
    "GpuHealthConfig",
    "ImportEnvConfig",
    "JobsConfig",
    "ModalConfig",
    "ModalRuntimeConfig",
    "ModelConfig",
    "PushConfig",
    "PushRuntimeConfig",
    "RetentionConfig",
    "RetryConfig",
    "RoutingConfig",
    "RuntimeConfig",
    "S3Config",
    "ServerConfig",
    "StopConditions",
    "TelemetryConfig",
    "TlsConfig",
    "UpstreamConfig",
    "UpstreamRuntimeConfig",
]

GATEWAY_KEYS = (
    "upstreams",
    "runtimes",
    "fallback_chain",
    "default_runtime",
    "stop_conditions",
    "models",
)


class StopConditions(ConfigModel):
    """When a runtime is disabled and drained automatically."""

    max_submits_per_job: int = Field(3, ge=1)
    max_stuck: int = Field(3, ge=1)
    disable_on_auth_error: bool = True


class JobsConfig(ConfigModel):
    """The timing of the job loops (dispatcher sweep, reaper)."""

    sweep_s: PositiveSeconds = 60.0
    reap_s: PositiveSeconds = 15.0
    quiet_s: PositiveSeconds = 60.0
    max_rescues: int = Field(3, ge=0)
    dispatcher_lease_s: PositiveSeconds = 600.0
    max_attempts_per_runtime: int = Field(2, ge=1)
    busy_deadline_s: PositiveSeconds = 3600.0  # no room this long after creation: fail


class ServerConfig(ConfigModel):
    """The HTTP server's limits and log format."""

    shutdown_grace_s: Seconds = 30.0
    drain_delay_s: Seconds = 0.0  # on SIGTERM: /readyz says 503 but requests are served this long
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=1)
    idempotency_ttl_s: PositiveSeconds = 86400.0
    max_idempotent_response_bytes: int = Field(1024 * 1024, ge=0)  # larger: not kept
    log_format: Literal["text", "json"] = "text"
    access_log: bool = True  # one INFO line per request (web/access_log.py)
    config_poll_s: PositiveSeconds = 2.0  # how often a replica looks for a new config/states
    behind_tls_proxy: bool = False  # clients reach us through a TLS-terminating proxy
    public_url: HttpUrl | None = None  # the gateway's address as clients know it
    # connection limits (issue #15 finding 3): web/connections.py
    header_timeout_s: PositiveSeconds = 10.0
    max_header_bytes: int = Field(64 * 1024, ge=1024)
    max_headers: int = Field(100, ge=1)
    body_timeout_s: PositiveSeconds = 30.0
    max_connections: int = Field(2048, ge=1)
    max_waiters: int = Field(512, ge=0)  # POST /v1/jobs?wait= waiting at once
    console_sample_s: float = Field(5.0, ge=0.5)  # the console charts' sample interval
    console_history_s: float = Field(3600.0, gt=0, le=86400)  # how far back they reach


def _implied_runtimes() -> list[RuntimeConfig]:
    return [UpstreamRuntimeConfig(id=IMPLIED_RUNTIME_ID)]


class GatewayConfig(ConfigModel):
    """The whole configuration of one gateway process, validated."""

    listen: ListenAddress = "127.0.0.1:8080"
    store: StoreUrl = "sqlite:///./gpugate.db"
    admin_token_env: EnvName | None = "GPUGATE_ADMIN_TOKEN"  # noqa: S105 - a name, not a secret
    gpu_health: GpuHealthConfig | None = None
    upstreams: list[UpstreamConfig] = Field(min_length=1)
    runtimes: list[RuntimeConfig] = Field(default_factory=_implied_runtimes)
    fallback_chain: list[str] = Field([IMPLIED_RUNTIME_ID], min_length=1)
    default_runtime: str = IMPLIED_RUNTIME_ID
    stop_conditions: StopConditions = StopConditions()
    models: list[ModelConfig] = Field(default_factory=list)  # fallbacks of the sync path
    jobs: JobsConfig = JobsConfig()
    server: ServerConfig = ServerConfig()
    blobs: BlobsConfig = BlobsConfig()
    import_env: ImportEnvConfig = ImportEnvConfig()
    retention: RetentionConfig = RetentionConfig()
    telemetry: TelemetryConfig = TelemetryConfig()  # OTLP traces (docs/observability.md)
    tls: TlsConfig | None = None  # HTTPS on listen and admin_listen; client_ca_file: mTLS
    admin_listen: ListenAddress | None = None  # /admin and /console on their own listener
    auth: AuthConfig = AuthConfig()  # client keys on the data plane and job routes
    #: file: a config file that differs from the version it last seeded becomes the new active
    #: version at start; store: the store's version wins (replicas managed by the admin API).
    config_source: Literal["file", "store"] = "file"

    _source_map: SourceMap = PrivateAttr(default_factory=SourceMap)

    @model_validator(mode="before")
    @classmethod
    def _implied_keys(cls, data: Any) -> Any:
        return resolve_implied(data) if isinstance(data, Mapping) else data

    @model_validator(mode="after")
    def _cross_field_rules(self, info: ValidationInfo) -> Self:
        if info.context and info.context.get(RULES_CHECKED):
            return self
        findings = rule_findings(self.model_dump())
        if findings:
            raise ValueError("; ".join(f"{format_path(f.path)}: {f.message}" for f in findings))
        return self

    def __eq__(self, other: object) -> bool:
        """Equal when the settings are: where they were read from does not count."""
        if not isinstance(other, GatewayConfig):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # lists inside: not hashable

    @property
    def source_map(self) -> SourceMap:
        """The line of each key in the file this config was read from (empty if none)."""
        return self._source_map

    def with_source_map(self, source_map: SourceMap) -> Self:
        """This config, remembering the lines of the file it was read from."""
        copy = self.model_copy()
        copy._source_map = source_map  # noqa: SLF001 - our own private attribute, on our copy
        return copy

    @property
    def host(self) -> str:
        """The host part of ``listen``, without the brackets of an IPv6 address."""
        return split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        """The port part of ``listen``."""
        return split_listen(self.listen)[1]

    @property
    def admin_address(self) -> tuple[str, int] | None:
        """``admin_listen`` as (host, port), or None when the admin plane is on ``listen``."""
        return None if self.admin_listen is None else split_listen(self.admin_listen)

    def upstream(self, upstream_id: str) -> UpstreamConfig:
        """The upstream with this id; :class:`KeyError` naming the defined ones if none."""
        for upstream in self.upstreams:
            if upstream.id == upstream_id:
                return upstream
        known = quoted_list([u.id for u in self.upstreams])
        raise KeyError(f"no upstream {upstream_id!r} (defined: {known})")

    def runtime(self, runtime_id: str) -> RuntimeConfig:
        """The runtime with this id; :class:`KeyError` naming the defined ones if none."""
        for runtime in self.runtimes:
            if runtime.id == runtime_id:
                return runtime
        known = quoted_list([r.id for r in self.runtimes])
        raise KeyError(f"no runtime {runtime_id!r} (defined: {known})")

    def served_models(self) -> list[str]:
        """Every model some OpenAI-compatible upstream serves, sorted (an ``azure-di``
        upstream's DI model ids are not models of the data plane or of jobs)."""
        return sorted(
            {
                model
                for upstream in self.upstreams
                if upstream.kind == "openai"
                for model in upstream.models
            }
        )

    def model_policy(self, name: str) -> ModelConfig | None:
        """The ``models[]`` entry of model ``name``, or None when it has none."""
        return next((m for m in self.models if m.name == name), None)

    def upstreams_serving(self, model: str) -> list[UpstreamConfig]:
        """The OpenAI-compatible upstreams that list ``model``, in file order."""
        return [u for u in self.upstreams if u.kind == "openai" and model in u.models]

    def azure_di_upstream(self, model: str) -> UpstreamConfig | None:
        """The ``azure-di`` upstream that lists DI model ``model`` (the rules allow one)."""
        return next((u for u in self.upstreams if u.kind == "azure-di" and model in u.models), None)

    def runtime_models(self, runtime_id: str) -> list[str]:
        """The models a runtime serves: its ``models``, or for ``kind: upstream`` without any,
        every upstream model."""
        runtime = self.runtime(runtime_id)
        if runtime.kind == "upstream" and not runtime.models:
            return self.served_models()
        return list(runtime.models)

    def gateway_document(self) -> dict[str, Any]:
        """The part that lives in the store: upstreams, runtimes, chain, default, stop conditions.

        JSON-able, in the file's schema, without the ``None`` values that are defaults.
        """
        return self.model_dump(mode="json", include=set(GATEWAY_KEYS))

    def process_document(self) -> dict[str, Any]:
        """The part only the file sets: listen, store, admin token, GPU health, jobs, server."""
        return self.model_dump(mode="json", exclude=set(GATEWAY_KEYS))

    def with_gateway_document(
        self,
        document: Mapping[str, Any],
        *,
        source: str = "<gateway document>",
        source_map: SourceMap | None = None,
        found: Sequence[Finding] = (),
    ) -> GatewayConfig:
        """This config with its gateway document replaced whole by ``document``.

        Validated like a file: :class:`ConfigError` lists every problem (with ``found``, the
        problems the caller found already), each with its line when ``source_map`` (of the
        document's own text) is given. Keys that are not part of the gateway document
        (``listen``, ...) are problems too, never silently applied.
        """
        if not isinstance(document, Mapping):
            got = describe(document)
            problem = ConfigProblem("", f"expected a mapping of gateway config keys, got {got}")
            raise ConfigError([problem], source=source)
        allowed = ", ".join(GATEWAY_KEYS)
        stray = [
            Finding((str(key),), f"not part of the gateway config (allowed: {allowed})")
            for key in document
            if key not in GATEWAY_KEYS
        ]
        # The document's keys first, so problems come in the document's order; lines only from
        # the document's own text: the file's process keys are valid already.
        merged = {key: value for key, value in document.items() if key in GATEWAY_KEYS}
        merged.update(self.process_document())
        lines = source_map or SourceMap()  # the file's process keys are valid: no problem
        config = validate_document(
            GatewayConfig, merged, lines, source=source, found=[*found, *stray]
        )
        return config.with_source_map(self.source_map.without(frozenset(GATEWAY_KEYS)))

    def summary_lines(self) -> list[str]:
        """A one-screen summary for ``gpugate check-config``."""
        return summary.summary_lines(self)
