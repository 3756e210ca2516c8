"""A job engine on a real store and a real gateway, in front of real fake model servers.

``rig(dsn, ...)`` builds the gateway with :func:`gpugate.wiring.build_gateway` (so the store,
the proxy and the shed gate are the real ones), an :class:`UpstreamRuntime` for every
``kind: upstream`` runtime, a :class:`ScriptedRuntime` for every other, and a dispatcher and a
reaper wired as the composition root will wire them. Time is a :class:`ManualClock`.

:class:`ScriptedRuntime` is a second implementation of the Runtime interface (standing for the
push and Modal runtimes that come later), steered by the test: not a mock of our code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpugate.clock import ManualClock
from gpugate.core.jobs import RuntimeView, runtime_views
from gpugate.core.lease import RESERVED_CALL
from gpugate.fleet import FakeExporter, ModelServer
from gpugate.services.dispatcher import Dispatcher
from gpugate.services.reaper import Reaper
from gpugate.services.runtimes import CallStatus, Runtime, Submission, UpstreamRuntime
from gpugate.store import JobEvent, JobRecord, NewJob, Store
from gpugate.web.batches import present
from gpugate.wiring import Gateway, build_gateway
from harness import make_config, upstream

CHAT = {"messages": [{"role": "user", "content": "hello"}]}


def push_runtime(runtime_id: str, models: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """A ``kind: push`` runtime entry (its worker is a :class:`ScriptedRuntime`)."""
    return {
        "id": runtime_id,
        "kind": "push",
        "models": models or ["qwen"],
        "push": {"url": "http://127.0.0.1:9/calls", "secret_env": "UNUSED_SECRET"},
        **extra,
    }


def modal_runtime(runtime_id: str, models: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """A ``kind: modal`` runtime entry (its function is a :class:`ScriptedRuntime`)."""
    return {
        "id": runtime_id,
        "kind": "modal",
        "models": models or ["qwen"],
        "modal": {"app": "worker", "function": "generate"},
        **extra,
    }


class ScriptedRuntime:
    """A runtime whose answers the test writes: ``script`` holds, per submit, an error to raise
    or None to accept; ``statuses`` what :meth:`status` says of a call (default running)."""

    def __init__(
        self, runtime_id: str, kind: str = "push", *, script: list[Exception | None] | None = None
    ) -> None:
        self.id = runtime_id
        self.kind = kind
        self.call_lease_s: float | None = None
        self.script: list[Exception | None] = list(script or [])
        self.submits: list[str] = []
        self.calls: dict[str, tuple[str, str]] = {}  # call id -> (slug, lease token)
        self.statuses: dict[str, CallStatus] = {}
        self.asked: list[str] = []
        self.confirmed: list[str] = []
        self.cancelled: list[str] = []
        self.during_submit: Callable[[JobRecord, str], Awaitable[None]] | None = None

    async def submit(self, job: JobRecord, lease_token: str) -> Submission:
        self.submits.append(job.slug)
        if self.during_submit is not None:
            await self.during_submit(job, lease_token)
        error = self.script.pop(0) if self.script else None
        if error is not None:
            raise error
        call_id = f"{self.id}-call-{len(self.submits)}"
        self.calls[call_id] = (job.slug, lease_token)
        return Submission(call_id, running=self.kind == "modal")

    async def confirm(self, call_id: str) -> None:
        self.confirmed.append(call_id)

    async def status(self, call_id: str) -> CallStatus:
        self.asked.append(call_id)
        if call_id not in self.calls:
            return CallStatus("unknown")
        return self.statuses.get(call_id, CallStatus("running"))

    async def cancel(self, call_id: str) -> None:
        self.cancelled.append(call_id)

    async def close(self) -> None:
        return None

    def forget(self) -> None:
        """Lose every call, as a restarted worker would."""
        self.calls.clear()

    def __repr__(self) -> str:
        return f"<ScriptedRuntime {self.id} submits={len(self.submits)}>"


@dataclass
class Rig:
    """The engine under test and the levers the tests pull."""

    gateway: Gateway
    clock: ManualClock
    servers: dict[str, ModelServer]
    runtimes: dict[str, Runtime]
    dispatcher: Dispatcher
    reaper: Reaper
    exporter: FakeExporter | None = None
    disabled: set[str] = field(default_factory=set)
    unreachable: set[str] = field(default_factory=set)
    over_budget: set[str] = field(default_factory=set)

    @property
    def store(self) -> Store:
        return self.gateway.store

    @property
    def local(self) -> UpstreamRuntime:
        runtime = self.runtimes["local"]
        assert isinstance(runtime, UpstreamRuntime)
        return runtime

    def scripted(self, runtime_id: str) -> ScriptedRuntime:
        runtime = self.runtimes[runtime_id]
        assert isinstance(runtime, ScriptedRuntime)
        return runtime

    def views(self) -> Mapping[str, RuntimeView]:
        return runtime_views(
            self.gateway.config,
            self.runtimes.keys(),
            disabled=self.disabled,
            unreachable=self.unreachable,
            over_budget=self.over_budget,
        )

    async def submit(
        self,
        slug: str,
        *,
        model: str = "qwen",
        runner: str | None = None,
        key: str | None = None,
        allow_external: bool = True,
        job_input: dict[str, Any] | None = None,
        operation: str = "chat/completions",
        job_class: str = "batch",
    ) -> JobRecord:
        new = NewJob(
            slug=slug,
            model=model,
            input=CHAT if job_input is None else job_input,
            operation=operation,
            job_class=job_class,
            runner=runner or self.gateway.config.default_runtime,
            idempotency_key=key,
            allow_external=allow_external,
        )
        job, _ = await self.store.create_job(new)
        return job

    async def job(self, slug: str) -> JobRecord:
        job = await self.store.get_job(slug)
        assert job is not None, f"no job {slug}"
        return job

    async def events(self, slug: str) -> list[JobEvent]:
        return await self.store.job_events(slug)

    async def trail(self, slug: str) -> list[tuple[str, str | None, str | None]]:
        """The job's events as ``(status, runtime, error_code)``."""
        return [(e.status, e.runtime, e.error_code) for e in await self.events(slug)]

    async def idle(self) -> None:
        """Wait until every call the upstream runtimes run has ended."""
        for runtime in self.runtimes.values():
            if isinstance(runtime, UpstreamRuntime):
                while runtime._tasks:
                    await asyncio.gather(*list(runtime._tasks), return_exceptions=True)

    async def until(
        self, slug: str, state: str, *, submitted: bool = False, within_s: float = 5.0
    ) -> JobRecord:
        """Wait (bounded, in real time) until the job is in ``state`` (and, ``submitted``, held
        by a runtime's call rather than by the dispatcher claiming it)."""
        async with asyncio.timeout(within_s):
            while (job := await self.job(slug)).state != state or (submitted and not _called(job)):
                await asyncio.sleep(0.01)
        return job

    def executions(self, server: str = "q0") -> dict[str, int]:
        """Answers the server produced, per job (a call cut off before its answer: none)."""
        return dict(self.servers[server].stats.executions)

    def received(self, server: str = "q0") -> dict[str, int]:
        """Requests the server received, per job."""
        return dict(self.servers[server].stats.received)


@contextlib.asynccontextmanager
async def rig(
    dsn: str,
    *,
    servers: Mapping[str, list[str]] | None = None,
    external: frozenset[str] = frozenset(),
    runtimes: list[dict[str, Any]] | None = None,
    chain: list[str] | None = None,
    default: str | None = None,
    jobs: dict[str, Any] | None = None,
    gpu_health: dict[str, Any] | None = None,
    stuck_after: int = 5,
) -> AsyncIterator[Rig]:
    """Fake model servers ``name -> models`` (default ``q0`` serving ``qwen``, on GPU 0), each
    an upstream of the same name (``external`` ones marked so), behind a gateway on ``dsn``."""
    servers = servers or {"q0": ["qwen"]}
    clock = ManualClock()
    async with contextlib.AsyncExitStack() as stack:
        exporter = None
        extra: dict[str, Any] = {}
        if gpu_health is not None:
            exporter = await stack.enter_async_context(FakeExporter(2))
            extra["gpu_health"] = {"dcgm_url": exporter.metrics_url, **gpu_health}
        started = {
            name: await stack.enter_async_context(ModelServer(models, name=name))
            for name, models in servers.items()
        }
        ups = [
            upstream(name, [s.url], list(s.models), gpu_ids=[0], external=name in external)
            for name, s in started.items()
        ]
        given = {
            "runtimes": runtimes,
            "fallback_chain": chain,
            "default_runtime": default,
            "jobs": jobs,
        }
        extra.update({key: value for key, value in given.items() if value is not None})
        config = make_config(dsn, ups, **extra)
        gateway = await stack.enter_async_context(
            build_gateway(
                config,
                environ={},
                clock=clock,
                probe_interval_s=3600.0,
                run_job_loops=False,
                present_error=present,
            )
        )
        built: dict[str, Runtime] = {}

        def freed() -> None:  # the runtimes' on_finished: the dispatcher is built below them
            dispatcher.slot_freed()

        for entry in config.runtimes:
            if entry.kind == "upstream":
                runtime = UpstreamRuntime(
                    entry.id, gateway.proxy, gateway.store, clock, on_finished=freed
                )
                stack.push_async_callback(runtime.close)
                built[entry.id] = runtime
            else:
                built[entry.id] = ScriptedRuntime(entry.id, entry.kind)
        disabled: set[str] = set()
        unreachable: set[str] = set()
        over_budget: set[str] = set()

        def views() -> Mapping[str, RuntimeView]:
            return runtime_views(
                gateway.config,
                built.keys(),
                disabled=disabled,
                unreachable=unreachable,
                over_budget=over_budget,
            )

        dispatcher = Dispatcher(gateway.store, built, views, gateway.config, clock)
        reaper = Reaper(
            gateway.store,
            built,
            gateway.config,
            clock,
            on_released=dispatcher.slot_freed,
            stuck_after=stuck_after,
        )
        yield Rig(
            gateway,
            clock,
            started,
            built,
            dispatcher,
            reaper,
            exporter,
            disabled=disabled,
            unreachable=unreachable,
            over_budget=over_budget,
        )


def _called(job: JobRecord) -> bool:
    """Whether the job's lease is a runtime's call, not the slot the dispatcher reserved for it."""
    return job.call is not None and job.call[1] != RESERVED_CALL
