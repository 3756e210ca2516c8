"""Writes docs/configuration.md from the config's pydantic models: every key, its type, default.

    python docs/config_reference.py          # rewrite docs/configuration.md
    python docs/config_reference.py --check  # exit 1 when the file is stale or a key lacks words

The models give the keys, types and defaults; ``MEANING`` below gives each key's meaning. A key
the models have and ``MEANING`` lacks is an error (tests/docs/test_config_reference.py runs the
check), so a new config key cannot ship undocumented.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gpugate.config import GatewayConfig
from gpugate.config.schema import GATEWAY_KEYS

TARGET = Path(__file__).resolve().parent / "configuration.md"


@dataclass(frozen=True)
class Key:
    path: str  # upstreams[].models, runtimes[].push.url, ...
    type: str
    default: str
    kinds: tuple[str, ...] = ()  # runtime kinds that have the key; () = every kind


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds (through Optional, list, dict, Annotated and unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        optional = " or null" if type(None) in args else ""
        return " \\| ".join(dict.fromkeys(names)) + optional
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map {_type_name(args[0])} → {_type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return _inline(value.model_dump())
    if value is None:
        return "null"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return (
            "`["
            + ", ".join(_inline(v.model_dump(exclude_defaults=True))[1:-1] for v in value)
            + "]`"
        )
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def _inline(data: dict[str, Any]) -> str:
    """A section's default in YAML flow style: ``{max_stuck: 3, ...}``."""
    parts = [
        f"{k}: {int(v) if isinstance(v, float) and v.is_integer() else v}" for k, v in data.items()
    ]
    return "`{" + ", ".join(parts).replace("True", "true").replace("False", "false") + "}`"


def _kind_of(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("kind")
    if field is None or get_origin(field.annotation) is not Literal:
        return None
    return str(get_args(field.annotation)[0])


def walk(model: type[BaseModel], prefix: str = "") -> Iterator[Key]:
    """Every key of ``model``, depth first, in the models' order."""
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = field.annotation
        nested = _models_in(annotation)
        listed = get_origin(annotation) is list or any(
            get_origin(a) is list for a in get_args(annotation)
        )
        yield Key(path, _type_name(annotation), _default(field))
        child = f"{path}[]." if listed else f"{path}."
        kinds = [k for k in (_kind_of(m) for m in nested) if k]
        if len(nested) > 1 and kinds:  # a discriminated union: merge the kinds' keys
            yield from _merged(nested, child)
        else:
            for sub in nested:
                yield from walk(sub, child)


def _merged(models: list[type[BaseModel]], prefix: str) -> Iterator[Key]:
    seen: dict[str, Key] = {}
    defaults: dict[str, dict[str, str]] = {}  # path -> kind -> default
    for model in models:
        kind = _kind_of(model) or ""
        for found in walk(model, prefix):
            defaults.setdefault(found.path, {})[kind] = found.default
            if found.path.endswith(".kind"):
                kinds = " \\| ".join(f"`{_kind_of(m)}`" for m in models)
                seen.setdefault(found.path, Key(found.path, kinds, "required"))
            seen.setdefault(found.path, found)
    for path, key in seen.items():
        by_kind = defaults[path]
        kinds = () if len(by_kind) == len(models) else tuple(by_kind)
        values = set(by_kind.values())
        default = (
            key.default
            if len(values) == 1 or path.endswith(".kind")
            else "; ".join(f"{kind}: {value}" for kind, value in by_kind.items())
        )
        yield Key(key.path, key.type, default, kinds)


MEANING: dict[str, str] = {
    "listen": "`HOST:PORT` the gateway serves on (`gpugate serve --listen` overrides it)",
    "store": "`sqlite:///path.db` (embedded, one process) or `postgresql://user@host/db` "
    "(replicas share it)",
    "admin_token_env": "the environment variable holding the admin token (admin API and "
    "console); unset or empty ⇒ the admin API and the console refuse everything",
    "gpu_health": "GPU health from dcgm-exporter; absent (or no `dcgm_url`/`exporters`) ⇒ "
    "dormant: no poller, no guard, no shed gate",
    "gpu_health.dcgm_url": "one exporter's `/metrics` URL; its GPUs are named by index "
    "(`gpu_ids: [0]`)",
    "gpu_health.exporters": "several exporters, one per host; GPUs are named `host/index`",
    "gpu_health.exporters[].host": "the name `gpu_ids` use for this exporter's GPUs",
    "gpu_health.exporters[].url": "its `/metrics` URL",
    "gpu_health.poll_s": "how often each exporter is scraped",
    "gpu_health.staleness_s": "no good scrape for this long ⇒ the GPU is stale: no verdict acts "
    "(fail open)",
    "gpu_health.sustained_samples": "saturated = the last N fresh util samples are all ≥ "
    "`shed_util_pct`",
    "gpu_health.shed_util_pct": "the utilisation (%) that counts toward saturation",
    "gpu_health.couple_faults": "a faulted GPU takes every upstream on it out of rotation",
    "gpu_health.shed_batch": "shed `batch` (sync 429, jobs deferred) when every candidate "
    "upstream is saturated; ships off",
    "gpu_health.fault_hold_s": "how long a fault holds after its last evidence (or until an "
    "operator clears it); while the newest scrape still shows the evidence it holds anyway",
    "gpu_health.max_temp_c": "a temperature at or above this is a thermal fault; null: no "
    "threshold",
    "gpu_health.scrape_timeout_s": "a scrape taking longer fails (counted; no verdict changes)",
    "gpu_health.xid_overrides": "XID code → severity, over the shipped table "
    "(`core/gpu/xid_severity.csv`), e.g. `{109: fatal}`",
    "upstreams": "the model servers the gateway forwards to (at least one)",
    "upstreams[].id": "the upstream's name (`X-Gateway-Upstream`, `/u/{id}/...`, metrics)",
    "upstreams[].kind": "`openai` (an OpenAI-compatible model server) or `azure-di` (an Azure "
    "Document Intelligence resource behind `/azure-di/...`; external, one `url`, no `gpu_ids`)",
    "upstreams[].cache": "opt-in result cache of the synchronous job front "
    "(`POST /v1/jobs?wait=`) for this upstream's models",
    "upstreams[].cache.ttl_s": "how long a cached result is served",
    "upstreams[].cache.max_entries": "entries kept per model (least recently used go first)",
    "runtimes[].cache": "opt-in result cache of the synchronous job front for jobs whose "
    "runner is this runtime (takes precedence over the upstream's)",
    "runtimes[].cache.ttl_s": "how long a cached result is served",
    "runtimes[].cache.max_entries": "entries kept per model (least recently used go first)",
    "upstreams[].url": "its one endpoint's base URL (exactly one of `url` and `urls`)",
    "upstreams[].urls": "several endpoint base URLs of the same upstream",
    "upstreams[].models": "the models it serves (the body's `model` routes to it)",
    "upstreams[].gpu_ids": "the GPUs it runs on: indexes with `dcgm_url`, `host/index` with "
    "`exporters`",
    "upstreams[].max_inflight": "admission pool size: requests in flight at once",
    "upstreams[].queue_timeout_s": "how long a request may wait for admission (then 503 "
    "`QUEUE_TIMEOUT`)",
    "upstreams[].timeout_s": "the whole upstream request's time limit (504 `UPSTREAM_TIMEOUT`)",
    "upstreams[].external": "a third-party API: jobs with `allow_external: false` never go here",
    "upstreams[].max_queue": "requests waiting beyond this are refused at once (503 `QUEUE_FULL`)",
    "upstreams[].connect_timeout_s": "time to connect to an endpoint",
    "upstreams[].first_byte_timeout_s": "non-streaming: send → the response's first byte, per "
    "try (then 504 `UPSTREAM_TIMEOUT` or the next candidate); null: `timeout_s` "
    "(docs/dataplane.md: why 45 s)",
    "upstreams[].first_token_timeout_s": "streaming: send → the first SSE data event, per try; "
    "the client's response headers are held until then, so a silent or failing start is "
    "retried or failed over invisibly",
    "upstreams[].stream_idle_timeout_s": "streaming: the longest silence between two events "
    "once the stream has begun (then a continuation, or the terminal `event: error`)",
    "upstreams[].retry": "how the sync path tries again on 429, 500/502/503/504, a connection "
    "that died before any response byte, or a missed deadline (docs/dataplane.md)",
    "upstreams[].retry.attempts": "tries of one request on this upstream's model, the first "
    "included (1 = no retry, but for the one try on another endpoint a refused connect always "
    "gets); retries also stay within a budget of 20 % of the upstream's requests over 10 s "
    "(at least 10)",
    "upstreams[].retry.backoff_s": "the first retry's backoff ceiling (full jitter: uniform in "
    "[0, ceiling], doubling per retry)",
    "upstreams[].retry.max_backoff_s": "the largest backoff ceiling: no retry waits longer "
    "unless the upstream's own `Retry-After` asked it to (a 429/503 without one is retried "
    "within it too)",
    "upstreams[].retry.retry_after_max_s": "the longest `Retry-After` waited for; a longer one "
    "goes to the next candidate (or back to the client) at once",
    "upstreams[].continuation": "how a stream broken mid-way may be continued on this upstream: "
    "`prefill` (the delivered text is sent as a trailing assistant message), `replay` (the "
    "same request again, output suppressed until it has passed the delivered text byte for "
    "byte; only for a deterministic request: `temperature` 0 or a `seed`), `none`",
    "models": "per-model policy of the sync path; a model not listed has no fallbacks",
    "models[].name": "the model (as the request body's `model` names it)",
    "models[].fallbacks": "models tried in order when this one cannot answer: every upstream "
    "failed (after retries), is out of rotation or answers 429/5xx; one no upstream serves is "
    "a warning (`check-config`, the log) and is passed over",
    "models[].price": "what the model costs through a client key (`/admin/usage` cents, the "
    "`daily_cents` limit); null: free",
    "models[].price.prompt_per_1k_cents": "cents per 1000 prompt tokens",
    "models[].price.completion_per_1k_cents": "cents per 1000 completion tokens",
    "models[].context_fallbacks": "models tried in order when this one answers 400 "
    "`context_length_exceeded`",
    "upstreams[].health_path": "the path the active health probe GETs every 5 s",
    "upstreams[].api_key_env": "the variable holding a bearer key sent to this upstream",
    "upstreams[].raw": "the opt-in for `/u/{id}/...` on an `azure-di`, `external` or keyed "
    "upstream (without it such an upstream answers 403 `RAW_FORBIDDEN` there); any upstream "
    "that has it, internal ones too, gets only its methods and path prefixes through `/u/` "
    "(the rest: 403 `RAW_FORBIDDEN`); null: `/u/` reaches only internal upstreams without a "
    "key, with every method and path (docs/security.md)",
    "upstreams[].raw.methods": "the HTTP methods `/u/` may forward to it",
    "upstreams[].raw.path_prefixes": "the raw paths (below the upstream's base URL) `/u/` may "
    "forward, by prefix",
    "upstreams[].raw.send_key": "add the upstream's key (`api_key_env`) to `/u/` requests; "
    "false: the client's headers go as they are, never the gateway's key",
    "upstreams[].engine": "scrape the model server's own metrics (running/waiting requests, KV "
    "use, prefix-cache hits, LoRA adapters) from each endpoint for routing; null: not scraped "
    "(docs/routing.md)",
    "upstreams[].engine.kind": "`auto` (read vLLM's, SGLang's or TEI's names, whichever the "
    "scrape has), `vllm`, `sglang`, `tei`, or `none` (scrape nothing)",
    "upstreams[].engine.metrics_path": "the path scraped on each endpoint",
    "upstreams[].engine.poll_s": "how often each endpoint is scraped",
    "upstreams[].engine.staleness_s": "a reading older than this is ignored: routing falls back "
    "to gpugate's outstanding counts (fail open)",
    "upstreams[].engine.scrape_timeout_s": "a scrape taking longer fails (counted, reading kept "
    "until stale)",
    "upstreams[].routing": "how this upstream's endpoints are chosen; null: the model's "
    "`routing`, else the defaults (docs/routing.md)",
    "upstreams[].routing.policy": "`least_outstanding` (power of two choices on gpugate's own "
    "count), `engine_load` (least loaded by the engine's queue and KV use), `prefix_affinity` "
    "(engine_load plus the prefix index, session and LoRA affinity)",
    "upstreams[].routing.prefix_weight": "a prompt's leading blocks missing on an endpoint cost "
    "this many queued requests there (scaled by the share of the prompt missing)",
    "upstreams[].routing.waiting_weight": "each request waiting in the engine (it could not "
    "start: slots or KV cache full) adds this much load on top of counting as outstanding",
    "upstreams[].routing.kv_weight": "a KV cache filling from 90 % to 100 % adds up to this "
    "much load",
    "upstreams[].routing.balance_abs": "affinity is ignored for an endpoint at least this much "
    "busier than the least loaded one (and `balance_rel` times as busy)",
    "upstreams[].routing.balance_rel": "... and at least this many times as busy",
    "upstreams[].routing.session_weight": "the conversation's last endpoint (`X-Session-Id`, else "
    "the body's `user`) is worth this many queued requests",
    "upstreams[].routing.lora_weight": "an endpoint with the requested LoRA adapter resident is "
    "worth this many queued requests",
    "upstreams[].routing.saturated_penalty": "`batch` sees an endpoint on saturated GPUs as this "
    "much busier",
    "upstreams[].routing.prefix_block_chars": "the prefix index hashes the rendered prompt in "
    "blocks of this many characters",
    "upstreams[].routing.prefix_max_blocks": "block hashes remembered per model (least recently "
    "used go first)",
    "upstreams[].routing.max_sessions": "sessions remembered (least recently used go first); 0: "
    "no session affinity",
    "runtimes": "where jobs run; absent ⇒ one runtime `local` of kind `upstream`",
    "runtimes[].id": "the runtime's name (`runner`, `fallback_chain`, the console)",
    "runtimes[].kind": "`upstream`: through the gateway's own upstreams; `push`: a machine "
    "running the push worker; `modal`: a Modal function",
    "runtimes[].models": "the models it serves; for `upstream` empty means every upstream model",
    "runtimes[].enabled": "false ⇒ configured but never dispatched to",
    "runtimes[].max_concurrency": "calls in flight on it at once, counted across replicas; "
    "null (upstream): no limit",
    "runtimes[].budget": "its daily spend guard; null: none",
    "runtimes[].budget.estimate_s": "the expected length of a call: each dispatch reserves "
    "`cents_per_second` times this against the budget, settled at the real cost when the call ends",
    "runtimes[].budget.daily_cents": "today's (UTC) spend ≥ this raises the soft-cap alert; "
    "≥ 2x ⇒ over budget, skipped in the walk",
    "runtimes[].budget.cents_per_second": "the cost of a call without a reported cost: its "
    "duration x this",
    "runtimes[].push": "where the push worker listens",
    "runtimes[].push.url": "the worker's `/calls` URL (`POST` submits, `GET /{call_id}` polls)",
    "runtimes[].push.secret_env": "the variable holding the secret shared with the worker",
    "runtimes[].push.auth": "`signed`: every push-protocol message is HMAC-signed both ways with "
    "keys derived from the secret, which never travels; `bearer`: compatibility with a worker "
    "that only sends the secret as a bearer token (docs/security.md)",
    "runtimes[].push.ca_file": "the CA bundle (PEM) that signed an `https://` worker's "
    "certificate; null: the system's CAs",
    "runtimes[].modal": "which Modal function runs the jobs",
    "runtimes[].modal.app": "the Modal app's name",
    "runtimes[].modal.function": "the function's name in the app",
    "runtimes[].modal.environment": "the Modal environment; null: the default one",
    "runtimes[].modal.token_id_env": "the variable holding the Modal token id",
    "runtimes[].modal.token_secret_env": "the variable holding the Modal token secret",
    "runtimes[].idle_exit_s": "how long an idle container lingers before it exits",
    "fallback_chain": "the order jobs walk the runtimes in; dispatch order is the policy; "
    "absent: every runtime's id, in the order `runtimes` lists them",
    "default_runtime": "the runtime a job without `runner` starts on; absent: the first of "
    "`fallback_chain`, so that jobs start where the chain says",
    "stop_conditions": "when the gateway disables and drains a runtime by itself, with the "
    "reason recorded",
    "stop_conditions.max_submits_per_job": "the same job submitted more than this many times",
    "stop_conditions.max_stuck": "more than this many stuck calls on one runtime",
    "stop_conditions.disable_on_auth_error": "a 401/403 answering a submit",
    "jobs": "the timing of the job loops",
    "jobs.sweep_s": "the dispatcher's safety-net sweep of queued jobs (a new job wakes it at once)",
    "jobs.reap_s": "how often the reaper looks at calls gone quiet or expired",
    "jobs.quiet_s": "a call with no news for this long is polled by the reaper",
    "jobs.max_rescues": "a job whose call is lost goes back to the queue up to this many times "
    "(then `LEASE_LOST`)",
    "jobs.dispatcher_lease_s": "the lease a dispatcher holds on a job while it submits",
    "jobs.max_attempts_per_runtime": "submits of one job to one runtime before the walk moves on",
    "jobs.busy_deadline_s": "a job every runtime refuses as busy (a worker's 429) or at capacity "
    "waits — deferred `RUNTIME_BUSY` with jittered backoff, no attempt spent — until this long "
    "after it was created, then fails `BUSY_DEADLINE`",
    "server": "process settings",
    "server.shutdown_grace_s": "on SIGTERM, how long requests in flight may finish",
    "server.drain_delay_s": (
        "on SIGTERM, how long the replica keeps serving with `/readyz` answering 503 before it "
        "stops accepting (load balancers take seconds to notice); `shutdown_grace_s` follows. "
        "0: stop accepting at once. Running in production: 5 (docs/production.md)"
    ),
    "server.max_body_bytes": "request bodies over this are refused (413 `PAYLOAD_TOO_LARGE`)",
    "server.idempotency_ttl_s": "how long a completed response is kept for `Idempotency-Key` "
    "replays, from its completion (a key in flight is held only as long as its request could "
    "last: docs/dataplane.md)",
    "server.access_log": "one line per request at INFO on the `gpugate.access` logger (method, "
    "path without its query, status, duration, and for the data plane the upstream, model and "
    "attempts); probes and `/metrics` at DEBUG; false (or `serve --no-access-log`): none",
    "server.max_idempotent_response_bytes": "a response body larger than this is not kept for "
    "`Idempotency-Key` replays (the key is released; a retry is sent again)",
    "server.log_format": "`text` or `json` lines on stderr",
    "server.config_poll_s": "how often each replica looks for a new config version and runtime "
    "states",
    "server.behind_tls_proxy": "clients reach the gateway through a proxy that terminates "
    "TLS: the console's session cookie is `Secure` and its pages send HSTS, as when `tls` is set",
    "server.public_url": "the gateway's base URL as clients know it (e.g. "
    "`https://gpu.example.com`): the Azure DI facade builds `Operation-Location` from it; null: "
    "only a loopback or the `listen` host is accepted as `Host` there (docs/security.md)",
    "server.header_timeout_s": "a client must send its request line and headers within this "
    "(from connecting, or a keep-alive request's first byte), else 408 `REQUEST_TIMEOUT` and "
    "the connection is closed",
    "server.max_header_bytes": "the request line and headers together, at most (431 "
    "`HEADERS_TOO_LARGE`)",
    "server.max_headers": "request headers, at most (431 `HEADERS_TOO_LARGE`)",
    "server.body_timeout_s": "the longest silence between two pieces of a request body while "
    "the gateway waits for it (408 `REQUEST_TIMEOUT`)",
    "server.max_connections": "client connections this replica serves at once; a request on "
    "one more gets 503 `TOO_MANY_CONNECTIONS` with `Retry-After` (keep it below the fd limit)",
    "server.max_waiters": "`POST /v1/jobs?wait=` requests waiting at once; one more gets its "
    "job at once (202, created and running) and polls `GET /v1/jobs/{slug}`",
    "server.console_sample_s": "how often the console's charts take a sample of the "
    "gateway's own metrics (in process, no scrape; docs/console.md)",
    "server.console_history_s": "how far back the console's charts reach: a ring of "
    "`console_history_s / console_sample_s` samples (at most 17 280), in memory, per replica",
    "retention": "how long finished rows are kept; a purge loop on every replica deletes "
    "older ones in small batches (docs/security.md). Absent (or a key left out): the defaults; "
    "every time must be more than 0 — `0` is refused at load, and nothing means 'keep "
    "forever': give a long time instead",
    "retention.jobs_s": "finished (completed, failed, cancelled) jobs, with their events and "
    "blobs, and settled ledger entries are deleted this long after they finished",
    "retention.audit_s": "audit events are deleted this long after they were written",
    "retention.batches_s": "ended batches, with their lines and files, are deleted this long "
    "after they ended; uploaded files no batch names, this long after the upload",
    "retention.every_s": "how often the purge runs (and once at start)",
    "retention.batch_rows": "rows deleted per transaction; a pass runs at most 50 of them per "
    "kind and leaves the rest to the next",
    "telemetry": "OpenTelemetry traces over OTLP/HTTP (the `gpugate[otel]` extra); off until "
    "`otlp_endpoint` is set (docs/observability.md)",
    "telemetry.otlp_endpoint": "an OTLP/HTTP collector's base URL (`http://collector:4318`): "
    "spans are POSTed as protobuf to `{otlp_endpoint}/v1/traces`; headers, certificates and "
    "compression come from the standard `OTEL_EXPORTER_OTLP_*` variables; null: no tracing",
    "telemetry.service_name": "the `service.name` of every span's resource",
    "telemetry.sample_ratio": "the share of new traces recorded (0 to 1); a client's "
    "`traceparent` decides for the traces it starts (parent-based)",
    "telemetry.export_timeout_s": "how long one export to the collector may take (in the "
    "exporter's thread, never the request's); at stop, the last flush is bounded by it too",
    "blobs": "where large job results go",
    "blobs.kind": "`local` (a directory) or `s3` (S3-compatible; needed by `modal` runtimes)",
    "blobs.dir": "the directory of the `local` blob store",
    "blobs.s3": "the bucket of the `s3` blob store",
    "blobs.s3.bucket": "the bucket's name",
    "blobs.s3.prefix": "the key prefix under which gpugate writes",
    "blobs.s3.endpoint_url": "an S3-compatible endpoint (MinIO, R2, ...); null: AWS",
    "blobs.s3.region_name": "the bucket's region; null: boto3's default",
    "blobs.s3.access_key_id_env": "the variable holding the access key id; null: boto3's own "
    "chain (instance role, `~/.aws`)",
    "blobs.s3.secret_access_key_env": "the variable holding the secret access key",
    "blobs.inline_max_bytes": "results up to this size stay in the job row; larger ones go to "
    "the blob store",
    "blobs.presign_s": "how long presigned URLs handed to a runtime live",
    "auth": "client identity on the data plane and the job routes (docs/keys.md)",
    "auth.mode": "`open`: no client identity, anyone who reaches `listen` may call every "
    "data-plane and job route (a demo, one user behind a firewall); `keys`: every such route "
    "needs a client key (`Authorization: Bearer`, `api-key` or `x-api-key`), 401 otherwise",
    "auth.bootstrap_keys_env": "the environment variable holding keys for automation: a JSON "
    "list of `{name, tenant, key, ...}` (the fields of `POST /admin/keys`, `key` the secret, "
    "`gk-` and 24+ characters), stored as `boot-<name>` at start; null: none",
    "auth.key_cache_s": "how long a replica trusts a key it looked up: a revoked, rotated or "
    "changed key takes effect on every other replica within this delay",
    "auth.usage_flush_s": "how often a replica writes its usage counts to the store "
    "(`/admin/usage` on another replica lags by up to this); the counts are priced"
    " (`models[].price`) as they are written",
    "auth.key_label": "also count tokens per key prefix in `gateway_key_tokens_total` (one "
    "series per key: only with few keys)",
    "auth.max_keys_cached": "the most key lookups a replica keeps, and as many wrong keys apart "
    "(a flood of wrong keys never pushes a real one out); the oldest go first",
    "tls": "serve HTTPS on `listen` (and `admin_listen`); null: plain HTTP (put a TLS proxy in "
    "front, docs/security.md)",
    "tls.cert_file": "the server's certificate chain (PEM)",
    "tls.key_file": "its private key (PEM)",
    "tls.client_ca_file": "a CA bundle (PEM): every client must present a certificate it signed "
    "(mTLS); null: no client certificate is asked for",
    "admin_listen": "`HOST:PORT` (another port than `listen`): `/admin` and `/console` are "
    "served there only, and answer 404 `NOT_FOUND` on `listen`; everything else — the data "
    "plane, jobs, `/healthz`, `/readyz`, `/metrics` — is served on `listen` only and answers "
    "404 there (probe and scrape `listen`); null: everything on `listen`",
    "config_source": "`file`: at start, a config file whose gateway keys (◆) differ from the "
    "version the file last stored becomes the new active version (audited, actor `file`), so "
    "editing the file and restarting is how a single node is run, while changes made through the "
    "admin API survive restarts of an unchanged file; `store`: the store's version always wins "
    "(replicas whose config is managed through the admin API)",
    "import_env": "which environment variables a config import (admin API, console) may name "
    "in a `*_env` key; the file may name any (docs/security.md)",
    "import_env.prefix": "an import may name any variable starting with this; null: none by prefix",
    "import_env.allow": "and these names (besides those the file's own gateway document names); "
    "never a variable a process key names (the admin token's, the blob store's keys)",
}
# models[].routing has the keys and meanings of upstreams[].routing (one RoutingConfig)
MEANING["models[].routing"] = (
    "how this model's endpoints are chosen; an upstream's own `routing` wins (docs/routing.md)"
)
MEANING.update(
    {
        key.replace("upstreams[]", "models[]", 1): meaning
        for key, meaning in list(MEANING.items())
        if key.startswith("upstreams[].routing.")
    }
)


def all_keys() -> list[Key]:
    return list(walk(GatewayConfig))


def missing() -> list[str]:
    """Keys of the models with no entry in ``MEANING``, and entries no model has."""
    have = {k.path for k in all_keys()}
    return sorted(have - set(MEANING)) + sorted(f"{p} (no such key)" for p in set(MEANING) - have)


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python docs/config_reference.py` from the pydantic models in",
        "     src/gpugate/config/; edit the models or MEANING there, never this file. -->",
        "",
        "One YAML file (`gpugate serve --config FILE`), validated at load: every problem is",
        "reported as `path.to.key: reason (line N)` and unknown keys are errors. Durations end",
        "in `_s`. Secrets are never in the file, only the names of the variables holding them",
        "(`*_env`). `gpugate check-config FILE` validates one. The *gateway* keys (marked ◆) live",
        "in the store as numbered versions after the first start and change by import or",
        "rollback (admin API, console, `gpugate config`); with `config_source: file` (the",
        "default) a file edited since it last seeded the store becomes the new version at the",
        "next start. The others always come from the file.",
        "",
        "`[]` in a path is an item of a list; a key with kinds applies to those runtime kinds.",
        "",
    ]
    parents = {k.path.split(".")[0].split("[")[0] for k in all_keys() if "." in k.path}
    every = sorted(all_keys(), key=lambda k: k.path.split(".")[0].split("[")[0] in parents)
    section = None
    for key in every:
        top = key.path.split(".")[0].split("[")[0]
        here = top if top in parents else "top level"
        if here != section:
            section = here
            mark = " ◆" if top in GATEWAY_KEYS else ""
            title = f"`{top}`{mark}" if top in parents else "Top level"
            lines += [
                "",
                f"## {title}",
                "",
                "| key | type | default | meaning |",
                "|---|---|---|---|",
            ]
        kinds = f" ({', '.join(key.kinds)} only)" if key.kinds else ""
        meaning = MEANING.get(key.path, "**undocumented**")
        mark = " ◆" if key.path in GATEWAY_KEYS and top not in parents else ""
        lines.append(f"| `{key.path}`{mark} | {key.type} | {key.default} | {meaning}{kinds} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when stale or incomplete")
    args = parser.parse_args(argv)
    problems = missing()
    for problem in problems:
        print(f"config key without a meaning in docs/config_reference.py: {problem}")
    text = render()
    if args.check:
        stale = not TARGET.exists() or TARGET.read_text() != text
        if stale:
            print(f"{TARGET} is stale: run python docs/config_reference.py")
        return 1 if problems or stale else 0
    TARGET.write_text(text)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
