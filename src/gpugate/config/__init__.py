"""gpugate's configuration: one typed tree, validated at start (DESIGN §2).

Foundation layer: imports only :mod:`gpugate.errors`, pydantic, PyYAML and the standard library.

    load_config(path)            YAML file      → GatewayConfig   (ConfigError lists every problem)
    parse_config(text)           YAML text      → GatewayConfig
    config_from_document(doc)    dict from JSON → GatewayConfig   (no lines)
    env_problems(config, env)    the required *_env variables that are unset or empty
    fallback_warnings(config)    the models[] fallbacks no upstream serves (warnings)
"""

from __future__ import annotations

from gpugate.config.environment import env_problems
from gpugate.config.loader import config_from_document, load_config, parse_config
from gpugate.config.schema import (
    GATEWAY_KEYS,
    BlobsConfig,
    BudgetConfig,
    CacheConfig,
    EngineConfig,
    ExporterConfig,
    GatewayConfig,
    GpuHealthConfig,
    JobsConfig,
    ModalConfig,
    ModalRuntimeConfig,
    ModelConfig,
    PushConfig,
    PushRuntimeConfig,
    RetentionConfig,
    RetryConfig,
    RoutingConfig,
    RuntimeConfig,
    S3Config,
    ServerConfig,
    StopConditions,
    TelemetryConfig,
    TlsConfig,
    UpstreamConfig,
    UpstreamRuntimeConfig,
)
from gpugate.config.source_map import SourceMap
from gpugate.config.validation import fallback_warnings

__all__ = [
    "GATEWAY_KEYS",
    "BlobsConfig",
    "BudgetConfig",
    "CacheConfig",
    "EngineConfig",
    "ExporterConfig",
    "GatewayConfig",
    "GpuHealthConfig",
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
    "SourceMap",
    "StopConditions",
    "TelemetryConfig",
    "TlsConfig",
    "UpstreamConfig",
    "UpstreamRuntimeConfig",
    "config_from_document",
    "env_problems",
    "fallback_warnings",
    "load_config",
    "parse_config",
]
