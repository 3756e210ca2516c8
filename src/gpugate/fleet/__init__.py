"""The simulated fleet: fake OpenAI-compatible model servers and a fake NVIDIA dcgm-exporter.

Tests, demos and benchmarks run against it. It imports nothing of the rest of gpugate (an
import-linter contract), so it cannot repeat the gateway's bugs; importing it starts nothing.

- `ModelServer` + `ServerBehaviour`: one model server, steered by ``POST /_control``.
- `Fault`, `RequestLog`: fault rules a server injects (``POST /_control/faults``) and the log of
  the requests it saw (``GET /_control/log``), so tests pin attempts and gaps.
- `FakeExporter` + `GpuReadings`: one dcgm-exporter, steered by ``POST /_control/gpus/{i}``.
- `Engine` + `EngineSpec`: a simulated LLM engine (slots, queue, KV cache with prefix reuse,
  vLLM's metrics) that times a model server's answers when its spec names one.
- `Fleet`, `FleetSpec`, `ServerSpec`, `ExporterSpec`, `demo_spec`, `serve_forever`: several
  of them on local ports at once.
"""

from gpugate.fleet.behaviour import ServerBehaviour
from gpugate.fleet.control import ControlError
from gpugate.fleet.engine import Engine, EngineSpec
from gpugate.fleet.exporter import MODES, ExporterMode, FakeExporter, HostLabel
from gpugate.fleet.exposition import DEFAULT_COUNTERS, OPTIONAL_COUNTERS
from gpugate.fleet.faults import KINDS as FAULT_KINDS
from gpugate.fleet.faults import Fault, RequestLog, gaps
from gpugate.fleet.fleet import (
    EXPORTER,
    ExporterSpec,
    Fleet,
    FleetSpec,
    ServerSpec,
    demo_spec,
    serve_forever,
)
from gpugate.fleet.gpu import XID_MESSAGES, GpuReadings, xid_message
from gpugate.fleet.model_server import ModelServer
from gpugate.fleet.replies import token_text
from gpugate.fleet.server_stats import ServerStats

__all__ = [
    "DEFAULT_COUNTERS",
    "EXPORTER",
    "FAULT_KINDS",
    "MODES",
    "OPTIONAL_COUNTERS",
    "XID_MESSAGES",
    "ControlError",
    "Engine",
    "EngineSpec",
    "ExporterMode",
    "ExporterSpec",
    "FakeExporter",
    "Fault",
    "Fleet",
    "FleetSpec",
    "GpuReadings",
    "HostLabel",
    "ModelServer",
    "RequestLog",
    "ServerBehaviour",
    "ServerSpec",
    "ServerStats",
    "demo_spec",
    "gaps",
    "serve_forever",
    "token_text",
    "xid_message",
]
