"""The composition root: the one place that builds every part of a gateway and wires them together.

``build_gateway(config)`` is an async context manager: on entry it opens the store, applies its
migrations, seeds (or loads) the gateway config version, builds every part in dependency order
and starts every loop; on exit it stops the loops in reverse order and closes the store. Nothing
else in gpugate names a concrete back end.

Every part is complete when it is constructed: its collaborators come through its constructor,
and nothing is set on it afterwards (docs/decisions.md §"The composition root"). The
:class:`Gateway` is a frozen record of those parts, every field required; an optional feature is
either a part that is always there and does nothing when unconfigured (client keys outside
``auth.mode: keys``, a job engine with no runtimes) or ``None`` by construction and for good
(``monitor`` while ``gpu_health`` is dormant). What a running gateway does change — the config
version in effect, the runtimes a new version adds, the upstreams' live state — lives inside
parts made for it (:class:`LiveConfig`, :class:`~gpugate.services.runtimes.table.Runtimes`,
:class:`~gpugate.core.registry.Registry`), swapped by :class:`Reconfigurer` alone.
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
from gpugate.services.batch_runner import BatchRunner, ErrorBody
from gpugate.services.batches import Batches, BatchFiles
from gpugate.services.config_versions import ConfigVersions
from gpugate.services.dispatcher import Dispatcher
from gpugate.services.engine_monitor import EngineMonitor
from gpugate.services.gpu_monitor import CLEARED, GpuMonitor
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
from gpugate.services.runtimes.table import Runtimes
from gpugate.services.runtimes.upstream import UpstreamRuntime
from gpugate.services.samples import Sampler
from gpugate.services.shed import ShedGate
from gpugate.services.stop_conditions import StopConditions
from gpugate.services.supervisor import Supervisor
from gpugate.services.sync_front import SyncFront
from gpugate.services.usage import UsageMeter
from gpugate.store import AuditRecord, JobRecord, Store
from gpugate.store.factory import open_store
from gpugate.telemetry import NO_TRACER, Tracer

log = logging.getLogger("gpugate")


class LiveConfig:
    """The gateway config version in effect: the one value a running gateway swaps whole.

    Every part that follows the config reads it through :meth:`get` (or :meth:`current`, with
    its version) when it acts, never a copy taken at construction; only
    :meth:`Reconfigurer.apply` swaps it, with no ``await`` in between, so nothing sees half of
    a version.
    """

    __slots__ = ("config", "version")

    def __init__(self, config: GatewayConfig, version: int) -> None:
        self.config = config
        self.version = version

    def get(self) -> GatewayConfig:
        return self.config

    def current(self) -> tuple[GatewayConfig, int]:
        return self.config, self.version

    def __repr__(self) -> str:
        return f"<LiveConfig version={self.version}>"


@dataclass(frozen=True, slots=True, eq=False)
class Reconfigurer:
    """Swaps in a new gateway config version, all at once (no await: no request or loop sees
    half of it). Upstreams that stay keep their endpoints' state and admission pools, so
    requests in flight finish undisturbed; a runtime new to this process gets its
    implementation, and so does a push or modal runtime whose ``push``/``modal`` block, kind or
    ``cents_per_second`` changed (its calls in flight are then answered by the new one); the
    chain and the runtimes' views follow the live config. Then ``room_changed`` (the
    dispatcher's ``slot_freed``): a version may raise a ``max_concurrency``, add or enable a
    runtime, so the jobs waiting for a slot look again at once, not after their backoff."""

    live: LiveConfig
    environ: Mapping[str, str] = field(repr=False)  # holds secrets: never in a repr
    metrics: Metrics
    registry: Registry
    proxy: Proxy
    monitor: GpuMonitor | None
    engine_monitor: EngineMonitor
    runtimes: Runtimes
    room_changed: Callable[[], None]

    def apply(self, config: GatewayConfig, version: int) -> None:
        before = self.live.config
        self.registry.reconfigure(config.upstreams)
        self.proxy.set_secrets(_secrets(config, self.environ))
        self.proxy.set_models(config.models)
        self.proxy.bind_gauges()
        if self.monitor is not None:
            self.monitor.reconfigure(config.upstreams)
        self.engine_monitor.reconfigure(config.upstreams)
        if (router := self.proxy.router) is not None:
            router.policy = scoring.policy_table(config.upstreams, config.models)
            kept = {url for upstream in config.upstreams for url in upstream.endpoints}
            for url in {u for up in before.upstreams for u in up.endpoints} - kept:
                router.forget(url)  # an endpoint that left: its prefixes with it
        self.runtimes.follow(before.runtimes, config.runtimes)  # built from `before`'s settings
        self.live.config, self.live.version = config, version
        self.metrics.config_version.set(version)
        self.room_changed()


@dataclass(frozen=True, slots=True, eq=False)
class Gateway:
    """Everything a running gateway is made of, each part complete; handed to the web layer.

    Frozen, and every field is required: :func:`build_gateway` makes the parts in dependency
    order and hands each its collaborators, so no field is filled in (and no part is patched)
    after construction. ``monitor`` is ``None`` when ``gpu_health`` is dormant — from the
    start, for the gateway's whole life.
    """

    live: LiveConfig  # the config version in effect (``config``, ``config_version``)
    store: Store
    metrics: Metrics
    clock: Clock
    environ: Mapping[str, str]
    import_environ: Mapping[str, str]  # what an import may name
    started_at: datetime
    tracer: Tracer  # OpenTelemetry spans (telemetry.otlp_endpoint), else no-ops
    registry: Registry
    proxy: Proxy
    idempotency: Idempotency
    prober: Prober
    blobs: BlobStore
    monitor: GpuMonitor | None  # None: gpu_health is dormant
    engine_monitor: EngineMonitor  # scrapes upstreams[].engine for routing
    login_throttle: FailureThrottle  # wrong admin tokens
    push_keys: PushKeys  # who sent a worker route's request
    keys: Keys  # client keys (enforced in auth.mode: keys)
    quota: Quota  # their limits
    usage: UsageMeter  # their usage
    azure_di: AzureDocumentIntelligence
    results: Results  # where job results are kept (inline or blobs)
    runtimes: Runtimes  # the runtimes with an implementation here, following the config
    runtime_ops: RuntimeOps
    guardrails: Guardrails
    stop_conditions: StopConditions
    dispatcher: Dispatcher
    reaper: Reaper
    push_reports: PushReports  # the worker routes' judge
    jobs: Jobs
    sync_front: SyncFront
    gauges: RuntimeGauges
    reconfigurer: Reconfigurer
    config_versions: ConfigVersions
    batches: Batches
    batch_runner: BatchRunner
    retention: Retention  # the purge of old rows (issue #15 finding 4)
    samples: Sampler  # the console charts' ring of samples
    lifecycle: Lifecycle
    loops: Supervisor  # owns every background loop; /readyz asks it

    @property
    def config(self) -> GatewayConfig:
        """The gateway config version in effect."""
        return self.live.config

    @property
    def config_version(self) -> int:
        return self.live.version

    @property
    def stopping(self) -> bool:
        """Draining or stopping: not ready for new traffic."""
        return not self.lifecycle.ready

    def apply_config(self, config: GatewayConfig, version: int) -> None:
        """Swap in a new gateway config version (:meth:`Reconfigurer.apply`)."""
        self.reconfigurer.apply(config, version)

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
async def build_gateway(  # noqa: PLR0913 - the config, then keyword-only settings
    file_config: GatewayConfig,
    *,
    environ: Mapping[str, str] | None = None,
    clock: Clock | None = None,
    probe_interval_s: float = 5.0,
    run_job_loops: bool = True,
    present_error: ErrorBody | None = None,
    processes: int = 1,
    takes_over: bool = True,
) -> AsyncIterator[Gateway]:
    """Build, start and finally stop a whole gateway (loops stop before the store closes).

    ``run_job_loops=False`` builds the job engine without starting its dispatcher and reaper
    loops, for tests that step them by hand. ``present_error``: how a gateway error looks as an
    HTTP answer (the web layer's table, :func:`gpugate.web.batches.present`), for the batch
    lines that record one; the caller above the web layer passes it, as this module may not
    import the web layer. ``processes``: this gateway is one of that many workers of
    ``serve --workers`` (each upstream's ``max_inflight`` is shared out among them);
    ``takes_over=False``: a SQLite store's leases are not all this process's to take back at
    start (a worker started beside live siblings: only lapsed leases are reaped).
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
        live = LiveConfig(config, version)
        metrics = Metrics()
        metrics.config_version.set(version)
        where = file_config.source_map.line(("telemetry", "otlp_endpoint"))
        tracer = open_tracer(file_config.telemetry, line=where)
        if tracer is not NO_TRACER:  # last out: exports the spans of everything stopped before
            stack.push_async_callback(asyncio.to_thread, tracer.shutdown)
        client = UpstreamClient()
        await client.start()
        stack.push_async_callback(client.close)
        monitor, gate = _gpu_health(config, client, clock, metrics, store)
        guard = monitor.guard if monitor is not None and monitor.cfg.couple_faults else None
        registry = Registry(config.upstreams, clock, guard=guard, processes=processes)
        engine_monitor, router = _routing(config, registry, monitor, client, clock, metrics)
        proxy = Proxy(
            registry,
            client,
            clock,
            metrics,
            secrets=_secrets(config, environ),
            gate=gate,
            models=config.models,
            router=router,
        )
        blobs = open_blobs(config.blobs, environ)
        stack.push_async_callback(blobs.close)
        prices = prices_of(live.get)  # one table for the quota and the usage meter
        quota = Quota(store, clock, metrics, prices)
        # a key's changed limits end its leases here
        keys = Keys(store, live.get, clock, looked_up=quota.limits_seen)
        await keys.load_bootstrap(environ)
        push_keys = PushKeys()
        engine = await _jobs_engine(
            _Parts(live, store, clock, metrics, environ, registry, proxy, blobs, push_keys),
            stack,
            tracer=tracer,
            takes_over=takes_over,
        )
        reconfigurer = Reconfigurer(
            live,
            environ,
            metrics,
            registry,
            proxy,
            monitor,
            engine_monitor,
            engine.runtimes,
            room_changed=engine.dispatcher.slot_freed,
        )
        import_environ = importable_environ(file_config, environ)
        files = BatchFiles(store, blobs, clock)
        batch_runner = BatchRunner(
            store,
            files,
            proxy,
            clock,
            present=present_error,
            takeover_at_start=store.backend == "sqlite",
        )
        server = config.server
        gateway = Gateway(
            live=live,
            store=store,
            metrics=metrics,
            clock=clock,
            environ=environ,
            import_environ=import_environ,
            started_at=clock.now(),
            tracer=tracer,
            registry=registry,
            proxy=proxy,
            idempotency=Idempotency(
                store,
                server.idempotency_ttl_s,
                max_body_bytes=server.max_idempotent_response_bytes,
                config=live.get,
            ),
            prober=Prober(registry, client, clock, metrics, interval_s=probe_interval_s),
            blobs=blobs,
            monitor=monitor,
            engine_monitor=engine_monitor,
            login_throttle=FailureThrottle(),
            push_keys=push_keys,
            keys=keys,
            quota=quota,
            usage=UsageMeter(store, clock, metrics, live.get, prices),
            azure_di=AzureDocumentIntelligence(proxy, live.get, clock),
            results=engine.results,
            runtimes=engine.runtimes,
            runtime_ops=engine.runtime_ops,
            guardrails=engine.guardrails,
            stop_conditions=engine.stop_conditions,
            dispatcher=engine.dispatcher,
            reaper=engine.reaper,
            push_reports=engine.push_reports,
            jobs=engine.jobs,
            sync_front=engine.sync_front,
            gauges=RuntimeGauges(
                store, engine.runtimes.keys, metrics, clock, interval_s=server.config_poll_s
            ),
            reconfigurer=reconfigurer,
            config_versions=ConfigVersions(
                store,
                live.current,
                reconfigurer.apply,
                import_environ,
                clock,
                poll_s=file_config.server.config_poll_s,
            ),
            batches=Batches(
                store, files, clock, wake=batch_runner.wake, cancel=batch_runner.cancel
            ),
            batch_runner=batch_runner,
            retention=Retention(
                store, blobs, clock, lambda: live.config.retention, metrics=metrics
            ),
            samples=_sampler(config, metrics, clock),
            lifecycle=Lifecycle(clock),
            loops=Supervisor(
                clock, on_restart=lambda loop: metrics.loop_restarts.labels(loop).inc()
            ),
        )
        _start_loops(gateway, stack, run_job_loops=run_job_loops)
        _warn_without_admin_token(gateway)
        try:
            yield gateway
        finally:
            gateway.lifecycle.stop()


def _warn_without_admin_token(gateway: Gateway) -> None:
    """Say at start that the admin API and the console will refuse everyone (a silent 401 later
    is how an operator would otherwise find out)."""
    if gateway.admin_token is None:
        name = gateway.config.admin_token_env
        log.warning(
            "no admin token: %s; the admin API and the console refuse every request",
            f"the variable {name} is unset or empty" if name else "admin_token_env is null",
        )


def _start_loops(gateway: Gateway, stack: AsyncExitStack, *, run_job_loops: bool) -> None:
    """Start every background loop of a built gateway; they stop (in reverse) with ``stack``."""
    loops, dispatcher, reaper = gateway.loops, gateway.dispatcher, gateway.reaper
    stack.push_async_callback(loops.stop)
    stack.push_async_callback(_hand_back, gateway, loops)  # unwound first: before loops.stop
    gateway.lifecycle.on("draining", lambda: _stop_claiming(gateway, loops))
    loops.start("prober", gateway.prober.run)
    loops.start("config-versions", gateway.config_versions.run)
    loops.start("runtime-states", gateway.runtime_ops.run)
    loops.start("guardrails", gateway.guardrails.run)
    if gateway.monitor is not None:
        loops.start("gpu-monitor", gateway.monitor.run)
    loops.start("engine-monitor", gateway.engine_monitor.run)
    gateway.metrics.count_jobs(
        lambda: asdict(dispatcher.totals),
        lambda: asdict(reaper.totals),
        lambda: reaper.stuck_by_runtime,
    )
    loops.start("job-gauges", gateway.gauges.run)
    loops.start("replica-heartbeat", ReplicaHeartbeat(gateway.store, gateway.clock).run)
    loops.start("retention", gateway.retention.run)
    loops.start("key-usage", gateway.usage.run)
    loops.start("key-slots", gateway.quota.run)
    loops.start("console-samples", gateway.samples.run)
    if run_job_loops:
        store = gateway.store
        loops.start("dispatcher", dispatcher.run)
        loops.start("reaper", reaper.run)
        loops.start("job-wakeups", lambda: store.watch_jobs(dispatcher.wake))
        loops.start("batches", gateway.batch_runner.run)


MAX_SAMPLES = 17_280  # a day at 5 s: the ring's bound whatever the config asks


def _sampler(config: GatewayConfig, metrics: Metrics, clock: Clock) -> Sampler:
    """The console's ring: ``server.console_history_s`` of samples every ``console_sample_s``."""
    server = config.server
    keep = min(MAX_SAMPLES, math.ceil(server.console_history_s / server.console_sample_s))
    return Sampler(metrics.read, clock, every_s=server.console_sample_s, keep=keep)


CLAIMING_LOOPS = ("dispatcher", "job-wakeups", "batches")
"""The loops that take new work from the store: a draining replica stops them first, so the
other replicas take the queue while it finishes what it holds."""
_LETS_FINISH = ("dispatcher",)  # told to stop and awaited: a cancel mid-walk loses a call


def _stop_claiming(gateway: Gateway, loops: Supervisor) -> None:
    """The drain began: the dispatcher finishes the job it walks and claims no more; the
    other claiming loops are cancelled."""
    gateway.dispatcher.stop()
    loops.stop_soon(tuple(name for name in CLAIMING_LOOPS if name not in _LETS_FINISH))


async def _hand_back(gateway: Gateway, loops: Supervisor) -> None:
    """On the way out: claim nothing more; after a signal, let this process's own calls (the
    ``upstream`` runtime's) finish within what is left of the grace; then put the dispatcher
    claims still held back in the queue for the other replicas (not after a 30 s silence)."""
    lifecycle = gateway.lifecycle
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


@dataclass(frozen=True, slots=True)
class _Parts:
    """What the job engine and the runtimes are built from (built before them)."""

    live: LiveConfig
    store: Store
    clock: Clock
    metrics: Metrics
    environ: Mapping[str, str] = field(repr=False)  # holds secrets: never in a repr
    registry: Registry
    proxy: Proxy
    blobs: BlobStore
    push_keys: PushKeys


@dataclass(frozen=True, slots=True)
class _JobEngine:
    """The runtimes, the dispatcher, the reaper and the jobs API service, each complete."""

    results: Results
    runtimes: Runtimes
    runtime_ops: RuntimeOps
    guardrails: Guardrails
    stop_conditions: StopConditions
    dispatcher: Dispatcher
    reaper: Reaper
    push_reports: PushReports
    jobs: Jobs
    sync_front: SyncFront


async def _jobs_engine(
    parts: _Parts, stack: AsyncExitStack, *, tracer: Tracer, takes_over: bool = True
) -> _JobEngine:
    """Runtimes, dispatcher, reaper and the jobs API service, wired to the live config.

    Every kind is built here, also when a new config version adds a runtime; a push runtime
    whose ``push.secret_env`` is unset is not (the walk skips it: ``no_implementation``).
    Runtimes an operator disabled or drained are skipped too (``disabled``), as
    :class:`RuntimeOps` last read their states. With SQLite one process owns the store, so
    every lease left over from a previous run is taken back at start-up (the reaper asks the
    runtime first) — unless ``takes_over`` is False (a worker of ``serve --workers`` started
    beside its running siblings, whose leases are live).

    The one cycle of the graph — the dispatcher walks the runtimes, and a runtime whose call
    ended frees a slot of the dispatcher — is closed by ``call_ended``, a function that names
    the dispatcher built below it and is first called when a call ends (after the loops
    started), not by setting anything on a part after it was built.
    """
    live, store, clock, metrics = parts.live, parts.store, parts.clock, parts.metrics
    config = live.config
    guardrails = Guardrails(store, live.get, metrics, clock, poll_s=config.jobs.reap_s)
    waiter = JobWaiter(store, clock, max_waiters=config.server.max_waiters)
    results = Results(parts.blobs, config.blobs.inline_max_bytes)

    def call_ended() -> None:  # a slot is free, spend to settle, sync-front waiters look
        dispatcher.slot_freed()
        guardrails.wake()
        waiter.pulse()

    push_client = PushClient()
    await push_client.start()
    stack.push_async_callback(push_client.close)
    build = _RuntimeFactory(parts, results, push_client, call_ended, stack)
    runtimes = Runtimes(config.runtimes, build)
    ops = RuntimeOps(
        store,
        live.get,
        parts.registry,
        runtimes.keys(),
        clock,
        poll_s=config.server.config_poll_s,
        spend_of=guardrails.spend,
    )
    await ops.tick()
    stops = StopConditions(ops, live.get, metrics)

    def views() -> dict[str, RuntimeView]:  # what the walk skips is what /admin/runtimes shows
        return runtime_views(
            live.config,
            runtimes.keys(),
            disabled=ops.excluded(),
            over_budget=guardrails.over_budget(),
            live_models=frozenset(parts.registry.models()),
        )

    dispatcher = Dispatcher(
        store, runtimes, views, live.get, clock, on_stop=stops.fire, tracer=tracer
    )
    drained = metrics.runtime_drained_calls
    reaper = Reaper(
        store,
        runtimes,
        live.get,
        clock,
        on_released=call_ended,
        draining=ops.draining,
        on_stuck=stops.check_stuck,
        on_drained=lambda runtime: drained.labels(runtime).inc(),
        results=results,
    )
    if store.backend == "sqlite" and takes_over:
        await reaper.recover()

    async def cancel_call(job: JobRecord) -> None:
        call = job.call
        if call is not None and call[0] in runtimes:
            await runtimes[call[0]].cancel(call[1])

    jobs = Jobs(
        store, live.get, wake=dispatcher.wake, cancel_call=cancel_call, call_ended=call_ended
    )
    return _JobEngine(
        results=results,
        runtimes=runtimes,
        runtime_ops=ops,
        guardrails=guardrails,
        stop_conditions=stops,
        dispatcher=dispatcher,
        reaper=reaper,
        push_reports=PushReports(store, live.get, on_finished=call_ended, results=results),
        jobs=jobs,
        sync_front=SyncFront(jobs, store, waiter, ResultCache(clock), parts.proxy, live.get),
    )


@dataclass(frozen=True, slots=True)
class _RuntimeFactory:
    """Builds the implementation of a configured runtime (None: a push runtime without its
    secret, or whose TLS settings cannot be loaded); each one built is closed with the gateway.
    A push runtime's secret is registered with the worker routes' keys (``push_keys``)."""

    parts: _Parts
    results: Results
    push_client: PushClient
    on_finished: Callable[[], None]
    stack: AsyncExitStack

    def __call__(self, entry: RuntimeConfig) -> Runtime | None:
        runtime = self._build(entry)
        if runtime is not None:
            self.stack.push_async_callback(runtime.close)
        return runtime

    def _build(self, entry: RuntimeConfig) -> Runtime | None:
        parts, config = self.parts, self.parts.live.config
        if isinstance(entry, PushRuntimeConfig):
            push = _push_runtime(config, parts.environ, parts.clock, entry, self.push_client)
            if push is not None:
                secret = parts.environ[entry.push.secret_env]
                parts.push_keys.set(entry.id, secret, auth=entry.push.auth)
            return push
        if isinstance(entry, ModalRuntimeConfig):
            return _modal_runtime(config, parts.environ, parts.blobs, parts.clock, entry)
        if entry.kind == "upstream":
            return UpstreamRuntime(
                entry.id,
                parts.proxy,
                parts.store,
                parts.clock,
                on_finished=self.on_finished,
                lease_s=config.jobs.quiet_s,
                results=self.results,
            )
        return None


def _modal_runtime(
    config: GatewayConfig,
    environ: Mapping[str, str],
    blobs: BlobStore,
    clock: Clock,
    entry: ModalRuntimeConfig,
) -> ModalRuntime:
    """A Modal runtime; its calls are polled by the reaper every ``jobs.reap_s``."""
    modal = entry.modal
    calls = ModalCalls(
        modal.app,
        modal.function,
        modal.environment,
        environ.get(modal.token_id_env, ""),
        environ.get(modal.token_secret_env, ""),
    )
    if not blobs.presigns:
        log.warning(
            "runtime %s (modal) needs an S3-compatible blob store (blobs: {kind: s3}) for its "
            "results; until then every submit to it fails RUNTIME_UNREACHABLE",
            entry.id,
        )
    return ModalRuntime(
        entry.id,
        calls,
        blobs,
        clock,
        cents_per_second=entry.budget.cents_per_second if entry.budget else 0.0,
        presign_s=config.blobs.presign_s,
        poll_s=config.jobs.reap_s / 2,  # expired by the reaper's next pass
    )


def _push_runtime(
    config: GatewayConfig,
    environ: Mapping[str, str],
    clock: Clock,
    entry: PushRuntimeConfig,
    client: PushClient,
) -> PushRuntime | None:
    """A push runtime, or None when its secret is unset; its workers report to the address
    the gateway listens on."""
    secret = environ.get(entry.push.secret_env)
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
        clock,
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
    monitor: GpuMonitor | None,
    client: UpstreamClient,
    clock: Clock,
    metrics: Metrics,
) -> tuple[EngineMonitor, scoring.Router]:
    """The engine monitor and the router the proxy calls where it picks (docs/routing.md),
    built before the proxy, which gets the router in its constructor."""

    def outstanding(upstream_id: str, url: str) -> int:
        for upstream in registry.upstreams():  # a scrape's lookup, not the hot path
            if upstream.id == upstream_id:
                for endpoint in upstream.endpoints:
                    if endpoint.url == url:
                        return endpoint.outstanding
        return 0

    engines = EngineMonitor(config.upstreams, client, clock, metrics, outstanding=outstanding)
    router = scoring.Router(
        scoring.policy_table(config.upstreams, config.models),
        signal=engines.signal,
        saturated=monitor.saturated if monitor is not None else None,
    )
    return engines, router


def _gpu_health(
    config: GatewayConfig, client: UpstreamClient, clock: Clock, metrics: Metrics, store: Store
) -> tuple[GpuMonitor | None, ShedGate | None]:
    """The monitor and the shed gate — or nothing at all when dormant, so a config without
    ``gpu_health`` behaves exactly as one whose monitor never existed. The monitor follows the
    operators' clears every process stores (the audit log), so a clear reaches every worker."""
    cfg = config.gpu_health
    if cfg is None or cfg.dormant:
        return None, None

    async def clears(since: datetime) -> list[AuditRecord]:
        return await store.list_audit(action=CLEARED, since=since, limit=500)

    monitor = GpuMonitor(cfg, config.upstreams, client, clock, metrics, clears=clears)
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
