"""The composition root: the one place that builds every part of a gateway and wires them together.

``build_gateway(config)`` is an async context manager: on entry it opens the store, applies its
migrations, seeds (or loads) the gateway config version and starts every loop; on exit it stops
the loops in reverse order and closes the store. Nothing else in gpugate names a concrete back end.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime

from gpugate.adapters.blobs import BlobStore, open_blobs
from gpugate.adapters.modal_calls import ModalCalls
from gpugate.adapters.push_client import PushClient
from gpugate.adapters.upstream_client import UpstreamClient
from gpugate.clock import Clock, SystemClock
from gpugate.config import (
    GatewayConfig,
    ModalRuntimeConfig,
    PushRuntimeConfig,
    RuntimeConfig,
    TelemetryConfig,
)
from gpugate.config.environment import importable_environ
from gpugate.core import scoring
from gpugate.core.jobs import RuntimeView, runtime_views
from gpugate.core.push_keys import PushKeys
from gpugate.core.registry import Registry
from gpugate.core.throttle import FailureThrottle
from gpugate.errors import ConfigError, ConfigProblem, GpugateError
from gpugate.metrics import Metrics
from gpugate.services.azure_di import AzureDocumentIntelligence
from gpugate.services.batch_runner import BatchRunner
from gpugate.services.batches import Batches
from gpugate.services.config_versions import ConfigVersions
from gpugate.services.dispatcher import Dispatcher
from gpugate.services.engine_monitor import EngineMonitor
from gpugate.services.gpu_monitor import GpuMonitor
from gpugate.services.guardrails import Guardrails
from gpugate.services.idempotency import Idempotency
from gpugate.services.job_gauges import RuntimeGauges
from gpugate.services.job_waiter import JobWaiter
from gpugate.services.jobs import Jobs
from gpugate.services.keys import Keys
from gpugate.services.limits import Quota, prices_of
from gpugate.services.prober import Prober
from gpugate.services.proxy import Proxy
from gpugate.services.readiness import Lifecycle, Readiness, probe
from gpugate.services.reaper import Reaper
from gpugate.services.replicas import ReplicaHeartbeat
from gpugate.services.result_cache import ResultCache
from gpugate.services.results import Results
from gpugate.services.retention import Retention
from gpugate.services.runtime_ops import RuntimeOps
from gpugate.services.runtimes.base import Runtime
from gpugate.services.runtimes.modal import ModalRuntime
from gpugate.services.runtimes.push import PushRuntime
from gpugate.services.runtimes.push_reports import PushReports
from gpugate.services.runtimes.upstream import UpstreamRuntime
from gpugate.services.samples import Sampler
from gpugate.services.shed import ShedGate
from gpugate.services.stop_conditions import StopConditions
from gpugate.services.supervisor import Supervisor
from gpugate.services.sync_front import SyncFront
from gpugate.services.usage import UsageMeter
from gpugate.store import JobRecord, Store
from gpugate.store.factory import open_store
from gpugate.telemetry import NO_TRACER, Tracer

log = logging.getLogger("gpugate")


@dataclass(slots=True)
class Gateway:
    """Everything a running gateway is made of; handed to the web layer."""

    config: GatewayConfig
    config_version: int
    store: Store
    metrics: Metrics
    clock: Clock
    environ: Mapping[str, str]
    started_at: datetime
    registry: Registry
    proxy: Proxy
    idempotency: Idempotency
    prober: Prober
    blobs: BlobStore
    monitor: GpuMonitor | None = None  # None: gpu_health is dormant
    engine_monitor: EngineMonitor | None = None  # scrapes upstreams[].engine for routing
    jobs: Jobs | None = None
    dispatcher: Dispatcher | None = None
    reaper: Reaper | None = None
    runtime_ops: RuntimeOps | None = None
    config_versions: ConfigVersions | None = None
    runtimes: dict[str, Runtime] = field(default_factory=dict)
    new_runtime: Callable[[RuntimeConfig], Runtime | None] | None = (
        None  # builds a runtime a new config adds
    )
    push_reports: PushReports | None = None  # the worker routes' judge
    gauges: RuntimeGauges | None = None
    samples: Sampler | None = None  # the console charts' ring of samples
    results: Results | None = None  # where job results are kept (inline or blobs)
    retention: Retention | None = None  # the purge of old rows (issue #15 finding 4)
    azure_di: AzureDocumentIntelligence | None = None
    sync_front: SyncFront | None = None
    batches: Batches | None = None
    batch_runner: BatchRunner | None = None
    guardrails: Guardrails | None = None
    stop_conditions: StopConditions | None = None
    import_environ: Mapping[str, str] = field(default_factory=dict)  # what an import may name
    login_throttle: FailureThrottle = field(default_factory=FailureThrottle)  # wrong admin tokens
    push_keys: PushKeys = field(default_factory=PushKeys)  # who sent a worker route's request
    keys: Keys | None = None  # client keys (auth.mode: keys)
    tracer: Tracer = NO_TRACER  # OpenTelemetry spans (telemetry.otlp_endpoint), else no-ops
    quota: Quota = field(init=False)  # their limits
    usage: UsageMeter = field(init=False)  # their usage
    lifecycle: Lifecycle = field(init=False)
    loops: Supervisor = field(init=False)  # owns every background loop; /readyz asks it

    def __post_init__(self) -> None:
        self.lifecycle = Lifecycle(self.clock)
        restarts = self.metrics.loop_restarts
        self.loops = Supervisor(self.clock, on_restart=lambda loop: restarts.labels(loop).inc())

    @property
    def stopping(self) -> bool:
        """Draining or stopping: not ready for new traffic."""
        return not self.lifecycle.ready

    @stopping.setter
    def stopping(self, value: bool) -> None:
        if value:
            self.lifecycle.stop()

    def apply_config(self, config: GatewayConfig, version: int) -> None:
        """Swap in a new gateway config version, all at once (no await: no request or loop
        sees half of it). Upstreams that stay keep their endpoints' state and admission pools,
        so requests in flight finish undisturbed; a runtime new to this process gets its
        implementation, and so does a push or modal runtime whose ``push``/``modal`` block,
        kind or ``cents_per_second`` changed (its calls in flight are then answered by the new
        one); the chain and the runtimes' views follow ``self.config``."""
        self.registry.reconfigure(config.upstreams)
        self.proxy.set_secrets(_secrets(config, self.environ))
        self.proxy.set_models(config.models)
        self.proxy.bind_gauges()
        if self.monitor is not None:
            self.monitor.reconfigure(config.upstreams)
        if self.engine_monitor is not None:
            self.engine_monitor.reconfigure(config.upstreams)
        if self.proxy.router is not None:
            self.proxy.router.policy = scoring.policy_table(config.upstreams, config.models)
            kept = {url for upstream in config.upstreams for url in upstream.endpoints}
            for url in {u for up in self.config.upstreams for u in up.endpoints} - kept:
                self.proxy.router.forget(url)  # an endpoint that left: its prefixes with it
        if self.new_runtime is not None:
            before = {entry.id: entry for entry in self.config.runtimes}
            for entry in config.runtimes:
                previous = before.get(entry.id)
                fresh = entry.id not in self.runtimes
                if not fresh and (previous is None or not _built_from_changed(previous, entry)):
                    continue
                if (built := self.new_runtime(entry)) is not None:
                    self.runtimes[entry.id] = built
                elif not fresh:
                    log.warning(
                        "runtime %s: kept as it was; its new settings cannot be built", entry.id
                    )
        self.config, self.config_version = config, version
        self.metrics.config_version.set(version)

    @property
    def admin_token(self) -> str | None:
        """The admin token, or None (the admin API then refuses everything)."""
        name = self.config.admin_token_env
        return (self.environ.get(name) or None) if name else None

    async def readiness(self) -> Readiness:
        """Store reachable, config loaded, not shutting down: each check listed."""

        async def store_ok() -> str:
            await self.store.ping()
            return f"{self.store.backend} reachable"

        async def config_ok() -> str:
            return f"version {self.config_version} loaded"

        async def loops_ok() -> str:
            if problems := self.loops.problems():
                raise GpugateError("; ".join(problems))
            return "every loop runs"

        async def accepting() -> str:
            if self.lifecycle.phase == "draining":
                raise GpugateError("draining: finishing what it has, taking no new work soon")
            if self.stopping:
                raise GpugateError("shutting down")
            return "accepting requests"

        checks = (
            await probe("store", store_ok),
            await probe("config", config_ok),
            await probe("lifecycle", accepting),
            await probe("loops", loops_ok),
        )
        return Readiness(checks)

    def __repr__(self) -> str:
        return (
            f"<Gateway config_version={self.config_version} store={self.store.backend} "
            f"upstreams={len(self.config.upstreams)} stopping={self.stopping}>"
        )


def _built_from_changed(old: RuntimeConfig, new: RuntimeConfig) -> bool:
    """Whether what a runtime's implementation was built from changed (models, enabled,
    max_concurrency and budgets are read live from the config instead)."""
    if old.kind != new.kind:
        return True
    rate_old = old.budget.cents_per_second if old.budget else None
    rate_new = new.budget.cents_per_second if new.budget else None
    if isinstance(old, PushRuntimeConfig) and isinstance(new, PushRuntimeConfig):
        return old.push != new.push or rate_old != rate_new
    if isinstance(old, ModalRuntimeConfig) and isinstance(new, ModalRuntimeConfig):
        return old.modal != new.modal or rate_old != rate_new
    return False


#: The actors of versions that came from the config file: the first seed, and later starts
#: with an edited file (``config_source: file``).
FILE_ACTORS = frozenset({"config-file", "file"})
#: How far back a start looks for the version the file last seeded.
_FILE_VERSION_LOOKBACK = 1000


async def _load_config_version(
    store: Store, file_config: GatewayConfig
) -> tuple[GatewayConfig, int]:
    """The file seeds the store on first start. Later, with ``config_source: file`` (the
    default), a file that differs from the version it last seeded becomes the new active
    version (audited, actor ``file``): editing the file and restarting is how a single node is
    run. With ``config_source: store``, or an unchanged file, the store's version is in effect
    (so changes made through the admin API survive a restart)."""
    document = file_config.gateway_document()
    current, seeded = await store.seed_config(document, actor="config-file")
    if seeded:
        log.info("seeded gateway config version %d from the config file", current.version)
        return file_config, current.version
    if current.document == document:
        return file_config, current.version
    if file_config.config_source == "file" and await _file_changed(store, document):
        saved = await store.save_config(document, actor="file", note="config file changed")
        log.info(
            "the config file changed since it last seeded the store: it is version %d now",
            saved.version,
        )
        return file_config, saved.version
    log.warning(
        "the store holds gateway config version %d, which differs from the config file; "
        "the store's version is in effect (%s)",
        current.version,
        "config_source: store"
        if file_config.config_source == "store"
        else "the file has not changed since it last seeded the store",
    )
    return file_config.with_gateway_document(current.document), current.version


async def _file_changed(store: Store, document: dict[str, object]) -> bool:
    """Whether ``document`` differs from the newest version the config file stored."""
    for version in await store.list_configs(_FILE_VERSION_LOOKBACK):
        if version.actor in FILE_ACTORS:
            return version.document != document
    return True  # the file's versions are older than the look-back: the file is the news


def _secrets(config: GatewayConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The values of the environment variables the config names for upstream credentials."""
    names = {u.api_key_env for u in config.upstreams if u.api_key_env}
    return {name: environ[name] for name in names if name in environ}


def open_tracer(config: TelemetryConfig, *, line: int | None = None) -> Tracer:
    """The OpenTelemetry tracer when ``telemetry.otlp_endpoint`` is set (the ``gpugate[otel]``
    extra, imported only then), else :data:`NO_TRACER`; ``line``: the key's in the file."""
    if config.otlp_endpoint is None:
        return NO_TRACER
    try:
        from gpugate.adapters.otel import OtelTracer
    except ImportError as exc:
        problem = ConfigProblem(
            "telemetry.otlp_endpoint",
            f"needs the OpenTelemetry extra: pip install 'gpugate[otel]' ({exc.name} is missing)",
            line,
        )
        raise ConfigError([problem]) from exc
    return OtelTracer(config)


@asynccontextmanager
async def build_gateway(
    file_config: GatewayConfig,
    *,
    environ: Mapping[str, str] | None = None,
    clock: Clock | None = None,
    probe_interval_s: float = 5.0,
    run_job_loops: bool = True,
) -> AsyncIterator[Gateway]:
    """Build, start and finally stop a whole gateway (loops stop before the store closes).

    ``run_job_loops=False`` builds the job engine without starting its dispatcher and reaper
    loops, for tests that step them by hand.
    """
    clock = clock or SystemClock()
    environ = os.environ if environ is None else environ
    async with AsyncExitStack() as stack:
        store = open_store(file_config.store, clock=clock)
        await store.open()
        stack.push_async_callback(store.close)
        applied = await store.migrate()
        if applied:
            log.info("store migrations applied: %s", ", ".join(applied))
        config, version = await _load_config_version(store, file_config)
        metrics = Metrics()
        metrics.config_version.set(version)
        where = file_config.source_map.line(("telemetry", "otlp_endpoint"))
        tracer = open_tracer(file_config.telemetry, line=where)
        if tracer is not NO_TRACER:  # last out: exports the spans of everything stopped before
            stack.push_async_callback(asyncio.to_thread, tracer.shutdown)
        client = UpstreamClient()
        await client.start()
        stack.push_async_callback(client.close)
        registry = Registry(config.upstreams, clock)
        monitor, gate = _gpu_health(config, registry, client, clock, metrics)
        proxy = Proxy(
            registry,
            client,
            clock,
            metrics,
            secrets=_secrets(config, environ),
            gate=gate,
            models=config.models,
        )
        engine_monitor = _routing(config, registry, proxy, monitor, client, clock, metrics)
        prober = Prober(registry, client, clock, metrics, interval_s=probe_interval_s)
        blobs = open_blobs(config.blobs, environ)
        stack.push_async_callback(blobs.close)
        gateway = Gateway(
            config=config,
            config_version=version,
            store=store,
            metrics=metrics,
            clock=clock,
            environ=environ,
            started_at=clock.now(),
            registry=registry,
            proxy=proxy,
            idempotency=Idempotency(
                store,
                config.server.idempotency_ttl_s,
                max_body_bytes=config.server.max_idempotent_response_bytes,
            ),
            prober=prober,
            blobs=blobs,
            monitor=monitor,
            engine_monitor=engine_monitor,
            tracer=tracer,
        )
        gateway.azure_di = AzureDocumentIntelligence(proxy, lambda: gateway.config, clock)
        await _client_keys(gateway)
        dispatcher, reaper = await _jobs_engine(gateway, stack)
        gateway.import_environ = importable_environ(file_config, environ)
        gateway.config_versions = ConfigVersions(
            store,
            lambda: (gateway.config, gateway.config_version),
            gateway.apply_config,
            gateway.import_environ,
            clock,
            poll_s=file_config.server.config_poll_s,
        )
        gateway.batches = Batches(store, blobs, clock)
        gateway.batch_runner = BatchRunner(
            store, gateway.batches, proxy, clock, takeover_at_start=store.backend == "sqlite"
        )
        _start_loops(gateway, stack, dispatcher, reaper, run_job_loops=run_job_loops)
        _warn_without_admin_token(gateway)
        try:
            yield gateway
        finally:
            gateway.stopping = True


async def _client_keys(gateway: Gateway) -> None:
    """Client keys, their limits and usage; the bootstrap keys of the environment stored."""

    def config() -> GatewayConfig:
        return gateway.config

    gateway.keys = Keys(gateway.store, config, gateway.clock)
    gateway.quota = Quota(gateway.store, gateway.clock, gateway.metrics, prices_of(config))
    gateway.usage = UsageMeter(gateway.store, gateway.clock, gateway.metrics, config)
    await gateway.keys.load_bootstrap(gateway.environ)


def _warn_without_admin_token(gateway: Gateway) -> None:
    """Say at start that the admin API and the console will refuse everyone (a silent 401 later
    is how an operator would otherwise find out)."""
    if gateway.admin_token is None:
        name = gateway.config.admin_token_env
        log.warning(
            "no admin token: %s; the admin API and the console refuse every request",
            f"the variable {name} is unset or empty" if name else "admin_token_env is null",
        )


def _start_loops(
    gateway: Gateway,
    stack: AsyncExitStack,
    dispatcher: Dispatcher,
    reaper: Reaper,
    *,
    run_job_loops: bool,
) -> None:
    """Start every background loop of a built gateway; they stop (in reverse) with ``stack``."""
    assert gateway.config_versions is not None
    assert gateway.runtime_ops is not None
    assert gateway.guardrails is not None
    assert gateway.batch_runner is not None
    loops = gateway.loops
    stack.push_async_callback(loops.stop)
    stack.push_async_callback(_hand_back, gateway, loops)  # unwound first: before loops.stop
    gateway.lifecycle.on("draining", lambda: _stop_claiming(gateway, loops))
    loops.start("prober", gateway.prober.run)
    loops.start("config-versions", gateway.config_versions.run)
    loops.start("runtime-states", gateway.runtime_ops.run)
    loops.start("guardrails", gateway.guardrails.run)
    if gateway.monitor is not None:
        loops.start("gpu-monitor", gateway.monitor.run)
    if gateway.engine_monitor is not None:
        loops.start("engine-monitor", gateway.engine_monitor.run)
    gateway.metrics.count_jobs(
        lambda: asdict(dispatcher.totals),
        lambda: asdict(reaper.totals),
        lambda: reaper.stuck_by_runtime,
    )
    gateway.gauges = RuntimeGauges(
        gateway.store,
        gateway.runtimes.keys,
        gateway.metrics,
        gateway.clock,
        interval_s=gateway.config.server.config_poll_s,
    )
    loops.start("job-gauges", gateway.gauges.run)
    loops.start("replica-heartbeat", ReplicaHeartbeat(gateway.store, gateway.clock).run)
    gateway.retention = Retention(
        gateway.store,
        gateway.blobs,
        gateway.clock,
        lambda: gateway.config.retention,
        metrics=gateway.metrics,
    )
    loops.start("retention", gateway.retention.run)
    loops.start("key-usage", gateway.usage.run)
    gateway.samples = _sampler(gateway)
    loops.start("console-samples", gateway.samples.run)
    if run_job_loops:
        store = gateway.store
        loops.start("dispatcher", dispatcher.run)
        loops.start("reaper", reaper.run)
        loops.start("job-wakeups", lambda: store.watch_jobs(dispatcher.wake))
        loops.start("batches", gateway.batch_runner.run)


MAX_SAMPLES = 17_280  # a day at 5 s: the ring's bound whatever the config asks


def _sampler(gateway: Gateway) -> Sampler:
    """The console's ring: ``server.console_history_s`` of samples every ``console_sample_s``."""
    server = gateway.config.server
    keep = min(MAX_SAMPLES, math.ceil(server.console_history_s / server.console_sample_s))
    return Sampler(gateway.metrics.read, gateway.clock, every_s=server.console_sample_s, keep=keep)


CLAIMING_LOOPS = ("dispatcher", "job-wakeups", "batches")
"""The loops that take new work from the store: a draining replica stops them first, so the
other replicas take the queue while it finishes what it holds."""
_LETS_FINISH = ("dispatcher",)  # told to stop and awaited: a cancel mid-walk loses a call


def _stop_claiming(gateway: Gateway, loops: Supervisor) -> None:
    """The drain began: the dispatcher finishes the job it walks and claims no more; the
    other claiming loops are cancelled."""
    if gateway.dispatcher is not None:
        gateway.dispatcher.stop()
    loops.stop_soon(tuple(name for name in CLAIMING_LOOPS if name not in _LETS_FINISH))


async def _hand_back(gateway: Gateway, loops: Supervisor) -> None:
    """On the way out: claim nothing more; after a signal, let this process's own calls (the
    ``upstream`` runtime's) finish within what is left of the grace; then put the dispatcher
    claims still held back in the queue for the other replicas (not after a 30 s silence)."""
    lifecycle = gateway.lifecycle
    if gateway.dispatcher is not None:
        gateway.dispatcher.stop()
    await loops.finish(_LETS_FINISH, within_s=max(1.0, lifecycle.remaining_s()))
    await loops.stop_named(CLAIMING_LOOPS)
    if lifecycle.deadline is not None:
        while _own_calls(gateway) and lifecycle.remaining_s() > 0:
            await gateway.clock.sleep(min(0.05, lifecycle.remaining_s()))
        if left := _own_calls(gateway):
            log.warning(
                "%d job call(s) still running at the end of the grace; another replica "
                "takes them back when their lease runs out (jobs.quiet_s)",
                left,
            )
    try:
        released = await gateway.store.release_replica(gateway.store.replica)
    except GpugateError as exc:
        log.warning("could not hand back the dispatcher claims: %s", exc.message)
        return
    if released:
        log.info("handed back %d dispatcher claim(s): %s", len(released), ", ".join(released))


def _own_calls(gateway: Gateway) -> int:
    """Job calls running inside this process (the ``upstream`` runtime's)."""
    return sum(r.running for r in gateway.runtimes.values() if isinstance(r, UpstreamRuntime))


async def _jobs_engine(gateway: Gateway, stack: AsyncExitStack) -> tuple[Dispatcher, Reaper]:
    """Runtimes, dispatcher, reaper and the jobs API service, wired to the live config.

    Every kind is built here, also when a new config version adds a runtime; a push runtime
    whose ``push.secret_env`` is unset is not (the walk skips it: ``no_implementation``).
    Runtimes an operator disabled or drained are skipped too (``disabled``), as
    :class:`RuntimeOps` last read their states. With SQLite one process owns the store, so
    every lease left over from a previous run is taken back at start-up (the reaper asks the
    runtime first).
    """
    store, clock = gateway.store, gateway.clock
    runtimes = gateway.runtimes  # shared with the dispatcher and the reaper; a new config adds

    def config() -> GatewayConfig:
        return gateway.config

    ops = RuntimeOps(
        store,
        config,
        gateway.registry,
        runtimes.keys(),
        clock,
        poll_s=gateway.config.server.config_poll_s,
    )

    guardrails = Guardrails(
        store, config, gateway.metrics, clock, poll_s=gateway.config.jobs.reap_s
    )
    ops.spend_of = guardrails.spend
    stops = StopConditions(ops, config, gateway.metrics)
    gateway.guardrails, gateway.stop_conditions = guardrails, stops

    def views() -> dict[str, RuntimeView]:
        return runtime_views(
            gateway.config,
            runtimes.keys(),
            disabled=ops.excluded(),
            over_budget=guardrails.over_budget(),
        )

    dispatcher = Dispatcher(
        store, runtimes, views, config, clock, on_stop=stops.fire, tracer=gateway.tracer
    )

    waiter = JobWaiter(store, clock, max_waiters=gateway.config.server.max_waiters)

    def call_ended() -> None:  # a slot is free, spend to settle, sync-front waiters look
        dispatcher.slot_freed()
        guardrails.wake()
        waiter.pulse()

    push_client = PushClient()
    await push_client.start()
    stack.push_async_callback(push_client.close)
    gateway.results = Results(gateway.blobs, gateway.config.blobs.inline_max_bytes)
    reports = PushReports(store, config, on_finished=call_ended, results=gateway.results)
    gateway.push_reports = reports

    def new_runtime(entry: RuntimeConfig) -> Runtime | None:
        runtime = _runtime_for(gateway, entry, push_client)
        if runtime is not None:
            stack.push_async_callback(runtime.close)
            if isinstance(runtime, UpstreamRuntime):
                runtime.on_finished = call_ended
        return runtime

    for entry in gateway.config.runtimes:
        if (runtime := new_runtime(entry)) is not None:
            runtimes[entry.id] = runtime
    gateway.new_runtime = new_runtime
    await ops.tick()
    gateway.runtime_ops = ops
    drained = gateway.metrics.runtime_drained_calls
    reaper = Reaper(
        store,
        runtimes,
        config,
        clock,
        on_released=call_ended,
        draining=ops.draining,
        on_stuck=stops.check_stuck,
        on_drained=lambda runtime: drained.labels(runtime).inc(),
        results=gateway.results,
    )
    if store.backend == "sqlite":
        await reaper.recover()

    async def cancel_call(job: JobRecord) -> None:
        call = job.call
        if call is not None and call[0] in runtimes:
            await runtimes[call[0]].cancel(call[1])

    gateway.dispatcher, gateway.reaper = dispatcher, reaper
    gateway.jobs = Jobs(store, config, wake=dispatcher.wake, cancel_call=cancel_call)
    gateway.sync_front = SyncFront(
        gateway.jobs, store, waiter, ResultCache(clock), gateway.proxy, config
    )
    return dispatcher, reaper


def _runtime_for(gateway: Gateway, entry: RuntimeConfig, push_client: PushClient) -> Runtime | None:
    """The implementation of a configured runtime (None: a push runtime without its secret);
    a push runtime's secret is registered with the worker routes' keys (``push_keys``)."""
    if isinstance(entry, PushRuntimeConfig):
        push = _push_runtime(gateway, entry, push_client)
        if push is not None:
            secret = gateway.environ[entry.push.secret_env]
            gateway.push_keys.set(entry.id, secret, auth=entry.push.auth)
        return push
    if isinstance(entry, ModalRuntimeConfig):
        return _modal_runtime(gateway, entry)
    if entry.kind == "upstream":
        quiet_s = gateway.config.jobs.quiet_s
        return UpstreamRuntime(
            entry.id,
            gateway.proxy,
            gateway.store,
            gateway.clock,
            lease_s=quiet_s,
            results=gateway.results,
        )
    return None


def _modal_runtime(gateway: Gateway, entry: ModalRuntimeConfig) -> ModalRuntime:
    """A Modal runtime; its calls are polled by the reaper every ``jobs.reap_s``."""
    config, environ = gateway.config, gateway.environ
    modal = entry.modal
    calls = ModalCalls(
        modal.app,
        modal.function,
        modal.environment,
        environ.get(modal.token_id_env, ""),
        environ.get(modal.token_secret_env, ""),
    )
    if not gateway.blobs.presigns:
        log.warning(
            "runtime %s (modal) needs an S3-compatible blob store (blobs: {kind: s3}) for its "
            "results; until then every submit to it fails RUNTIME_UNREACHABLE",
            entry.id,
        )
    return ModalRuntime(
        entry.id,
        calls,
        gateway.blobs,
        gateway.clock,
        cents_per_second=entry.budget.cents_per_second if entry.budget else 0.0,
        presign_s=config.blobs.presign_s,
        poll_s=config.jobs.reap_s / 2,  # expired by the reaper's next pass
    )


def _push_runtime(
    gateway: Gateway, entry: PushRuntimeConfig, client: PushClient
) -> PushRuntime | None:
    """A push runtime, or None when its secret is unset; its workers report to the address
    the gateway listens on."""
    config = gateway.config
    secret = gateway.environ.get(entry.push.secret_env)
    if not secret:
        log.warning(
            "runtime %s: %s is not set; the runtime is not built and jobs skip it",
            entry.id,
            entry.push.secret_env,
        )
        return None
    try:
        tls = _push_tls(config, entry)
    except (OSError, ssl.SSLError) as exc:
        log.warning("runtime %s: its TLS settings cannot be loaded (%s); not built", entry.id, exc)
        return None
    host = config.host if config.host not in ("0.0.0.0", "::", "") else "127.0.0.1"  # noqa: S104
    host = f"[{host}]" if ":" in host else host
    budget = entry.budget
    return PushRuntime(
        entry.id,
        str(entry.push.url),
        secret,
        client.for_runtime(auth=entry.push.auth, tls=tls),
        gateway.clock,
        gateway_url=f"{'https' if config.tls else 'http'}://{host}:{config.port}",
        cents_per_second=budget.cents_per_second if budget is not None else None,
    )


def _push_tls(config: GatewayConfig, entry: PushRuntimeConfig) -> ssl.SSLContext | None:
    """How the gateway reaches an ``https://`` worker: trusting ``push.ca_file`` (else the
    system's CAs) and presenting the gateway's own ``tls`` certificate, for a worker that
    requires a client certificate (``--tls-client-ca-file``)."""
    if entry.push.ca_file is None and config.tls is None:
        return None
    context = ssl.create_default_context(cafile=entry.push.ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if config.tls is not None:
        context.load_cert_chain(config.tls.cert_file, config.tls.key_file)
    return context


def _routing(
    config: GatewayConfig,
    registry: Registry,
    proxy: Proxy,
    monitor: GpuMonitor | None,
    client: UpstreamClient,
    clock: Clock,
    metrics: Metrics,
) -> EngineMonitor:
    """The engine monitor and the router the proxy calls where it picks (docs/routing.md)."""

    def outstanding(upstream_id: str, url: str) -> int:
        for upstream in registry.upstreams():  # a scrape's lookup, not the hot path
            if upstream.id == upstream_id:
                for endpoint in upstream.endpoints:
                    if endpoint.url == url:
                        return endpoint.outstanding
        return 0

    engines = EngineMonitor(config.upstreams, client, clock, metrics, outstanding=outstanding)
    proxy.router = scoring.Router(
        scoring.policy_table(config.upstreams, config.models),
        signal=engines.signal,
        saturated=monitor.saturated if monitor is not None else None,
    )
    return engines


def _gpu_health(
    config: GatewayConfig,
    registry: Registry,
    client: UpstreamClient,
    clock: Clock,
    metrics: Metrics,
) -> tuple[GpuMonitor | None, ShedGate | None]:
    """The monitor, the fault guard and the shed gate — or nothing at all when dormant, so a
    config without ``gpu_health`` behaves exactly as one whose monitor never existed."""
    cfg = config.gpu_health
    if cfg is None or cfg.dormant:
        return None, None
    monitor = GpuMonitor(cfg, config.upstreams, client, clock, metrics)
    if cfg.couple_faults:
        registry.guard = monitor.guard
    gate = ShedGate(monitor, metrics, retry_after_s=cfg.poll_s) if cfg.shed_batch else None
    return monitor, gate


async def upgrade_store(dsn: str, *, clock: Clock | None = None) -> list[str]:
    """Apply pending migrations to the store at ``dsn`` (``gpugate db upgrade``)."""
    store = open_store(dsn, clock=clock or SystemClock())
    await store.open()
    try:
        return await store.migrate()
    finally:
        await store.close()
