"""The one-screen summary ``gpugate check-config`` prints for a valid config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpugate.config.fields import redact_store_url

if TYPE_CHECKING:
    from gpugate.config.gpu_health import GpuHealthConfig
    from gpugate.config.runtime import RuntimeConfig
    from gpugate.config.schema import GatewayConfig
    from gpugate.config.upstream import UpstreamConfig


def summary_lines(config: GatewayConfig) -> list[str]:
    """Listen, store, admin, GPU health, each upstream and runtime, the chain and the default."""
    admin = (
        f"token from ${config.admin_token_env}"
        if config.admin_token_env
        else "off (no admin_token_env: the admin API refuses everything)"
    )
    lines = [
        f"listen          {config.listen}",
        f"store           {redact_store_url(config.store)}",
        f"admin           {admin}",
        f"gpu health      {_gpu_health(config.gpu_health)}",
    ]
    lines += [_upstream(upstream) for upstream in config.upstreams]
    lines += [_runtime(runtime) for runtime in config.runtimes]
    lines += [
        f"fallback chain  {' -> '.join(config.fallback_chain)}",
        f"default runtime {config.default_runtime}",
    ]
    return lines


def _gpu_health(gpu_health: GpuHealthConfig | None) -> str:
    if gpu_health is None or gpu_health.dormant:
        return "dormant (no dcgm_url or exporters)"
    where = gpu_health.dcgm_url or ", ".join(f"{e.host}={e.url}" for e in gpu_health.exporters)
    shed = f"{gpu_health.shed_util_pct:g}% x{gpu_health.sustained_samples}"
    switches = [
        f"every {gpu_health.poll_s:g}s",
        f"faults {'remove upstreams' if gpu_health.couple_faults else 'only reported'}",
        f"batch shed {'on' if gpu_health.shed_batch else 'off'} at {shed}",
    ]
    return f"{where} ({', '.join(switches)})"


def _upstream(upstream: UpstreamConfig) -> str:
    gpus = ", ".join(str(gpu) for gpu in upstream.gpu_ids) or "none"
    external = " external" if upstream.external else ""
    return (
        f"upstream        {upstream.id}{external}: {' '.join(upstream.endpoints)}"
        f" models={','.join(upstream.models)} gpus={gpus} max_inflight={upstream.max_inflight}"
    )


def _runtime(runtime: RuntimeConfig) -> str:
    models = ",".join(runtime.models) or "(every upstream model)"
    parts = [f"runtime         {runtime.id} ({runtime.kind}) models={models}"]
    if runtime.max_concurrency is not None:
        parts.append(f"max_concurrency={runtime.max_concurrency}")
    if runtime.budget is not None:
        parts.append(f"budget={runtime.budget.daily_cents:g}c/day")
    if not runtime.enabled:
        parts.append("DISABLED")
    return " ".join(parts)
