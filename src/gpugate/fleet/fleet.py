"""A simulated fleet: several fake model servers and one fake dcgm-exporter on local ports."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Self

from gpugate.fleet.behaviour import ServerBehaviour
from gpugate.fleet.engine import EngineSpec
from gpugate.fleet.exporter import DEFAULT_MODEL_NAME, FakeExporter, HostLabel
from gpugate.fleet.exposition import DEFAULT_COUNTERS
from gpugate.fleet.faults import Fault
from gpugate.fleet.model_server import ModelServer

if TYPE_CHECKING:
    import socket

EXPORTER = "exporter"
"""The key of the exporter in `ports` and in `Fleet.describe()`; no server may be named so."""


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One fake model server of a fleet."""

    name: str
    models: Sequence[str]
    behaviour: ServerBehaviour = field(default_factory=ServerBehaviour)
    embedding_dim: int = 8
    engine: EngineSpec | None = None  # a simulated engine with a prefix cache times the answers
    faults: Sequence[Fault] = ()  # rules armed from the start, e.g. one model rejects prefill

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "faults", tuple(self.faults))
        if not self.models:
            raise ValueError(f"server {self.name!r}: models must not be empty")
        if self.name == EXPORTER:
            raise ValueError(f"{EXPORTER!r} names the exporter; choose another server name")


@dataclass(frozen=True, slots=True)
class ExporterSpec:
    """The fake dcgm-exporter of a fleet (see `FakeExporter` for the knobs)."""

    hostname: str = "fleet-node"
    host_label: HostLabel = "Hostname"
    model_name: str = DEFAULT_MODEL_NAME
    counters: frozenset[str] = DEFAULT_COUNTERS
    emit_xid: bool = True
    xid_window_s: float = 300.0


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """Which servers to run, and how many GPUs the exporter shows."""

    servers: Sequence[ServerSpec]
    gpus: int = 2
    exporter: ExporterSpec = field(default_factory=ExporterSpec)

    def __post_init__(self) -> None:
        object.__setattr__(self, "servers", tuple(self.servers))
        names = [server.name for server in self.servers]
        if len(set(names)) != len(names):
            raise ValueError(f"server names must be unique: {names}")


def demo_spec() -> FleetSpec:
    """The seed's fleet: a chat model and its smaller stand-in, a small cleanup model,
    embeddings, a classifier; 2 GPUs."""
    return FleetSpec(
        servers=(
            ServerSpec(name="qwen-35b", models=("qwen-35b",)),
            ServerSpec(name="qwen-7b", models=("qwen-7b",)),
            ServerSpec(name="cleanup-3b", models=("cleanup-3b",)),
            ServerSpec(name="tei-embeddings", models=("bge-m3",)),
            ServerSpec(name="doc-classifier", models=("doc-classifier",)),
        ),
        gpus=2,
    )


class Fleet:
    """Runs a `FleetSpec` on `host`: ``async with Fleet(spec) as fleet: fleet.servers[name].url``.

    `ports` maps server names (and `EXPORTER`) to fixed ports, or to sockets the caller bound
    on `host` (which the fleet then serves on and closes); the rest get free ports.
    Leaving the context stops everything and closes every connection, streams included.
    """

    def __init__(
        self,
        spec: FleetSpec,
        *,
        host: str = "127.0.0.1",
        ports: Mapping[str, int | socket.socket] | None = None,
    ) -> None:
        self.spec = spec
        self.host = host
        self._ports = dict(ports or {})
        unknown = sorted(set(self._ports) - {s.name for s in spec.servers} - {EXPORTER})
        if unknown:
            raise ValueError(f"ports for unknown servers {unknown}")
        self.servers: dict[str, ModelServer] = {
            s.name: ModelServer(
                s.models,
                name=s.name,
                behaviour=s.behaviour,
                embedding_dim=s.embedding_dim,
                engine=s.engine,
                faults=s.faults,
            )
            for s in spec.servers
        }
        e = spec.exporter
        self.exporter = FakeExporter(
            spec.gpus,
            hostname=e.hostname,
            host_label=e.host_label,
            model_name=e.model_name,
            counters=e.counters,
            emit_xid=e.emit_xid,
            xid_window_s=e.xid_window_s,
        )
        self._running = False

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        return f"<Fleet {state} servers={len(self.servers)} gpus={len(self.exporter.gpus)}>"

    async def start(self) -> None:
        """Start every server and the exporter; if one fails, stop those already started."""
        try:
            async with asyncio.TaskGroup() as group:
                for name, server in self.servers.items():
                    group.create_task(server.start(self.host, self._ports.get(name, 0)))
                group.create_task(self.exporter.start(self.host, self._ports.get(EXPORTER, 0)))
        except BaseException:
            await self.stop()
            raise
        self._running = True

    async def stop(self) -> None:
        """Stop everything, concurrently (idempotent)."""
        self._running = False
        async with asyncio.TaskGroup() as group:
            for server in self.servers.values():
                group.create_task(server.stop())
            group.create_task(self.exporter.stop())

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def describe(self) -> list[str]:
        """One line per member, ``name  url  models``, in aligned columns, for printing."""
        rows = [(name, s.url, ", ".join(s.models)) for name, s in self.servers.items()]
        e = self.exporter
        rows.append((EXPORTER, e.metrics_url, f"{len(e.gpus)} GPUs on {e.hostname}"))
        return _columns(rows)


def _columns(rows: Iterable[tuple[str, ...]]) -> list[str]:
    rows = list(rows)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


OnReady = Callable[[Fleet], object]


async def serve_forever(
    spec: FleetSpec,
    *,
    host: str = "127.0.0.1",
    ports: Mapping[str, int] | None = None,
    on_ready: OnReady | None = None,
) -> None:
    """Run the fleet until cancelled; `on_ready(fleet)` (sync or async) runs once it is up."""
    async with Fleet(spec, host=host, ports=ports) as fleet:
        if on_ready is not None:
            result = on_ready(fleet)
            if inspect.isawaitable(result):
                await result
        await asyncio.Event().wait()
