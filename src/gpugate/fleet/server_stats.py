"""What a fake model server has seen, for tests (``GET /_stats``) and for ``GET /metrics``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

_RUNNING_HELP = "Number of requests in model execution batches."
_WAITING_HELP = "Number of requests waiting to be processed."
_KV_HELP = "KV-cache usage. 1 means 100 percent usage."
_REQUESTS_HELP = "Requests received by this fake server, by route."


class ServerStats:
    """Counters of one fake model server.

    - `requests`: requests received per route (model routes, ``/health``, ``/metrics``);
    - `open_requests` / `open_streams`: model requests (of which streams) being answered now;
    - `held`: model requests held by `hang` now;
    - `disconnects`: model requests whose client went away before the answer was complete;
    - `resets`: connections the server aborted on purpose (`reset_after_chunks`,
      `drop_connection`);
    - `received`: model requests per value of the `Idempotency-Key` header, or else of
      `X-Gpugate-Job`, counted as they arrive;
    - `executions`: the same keys, counted when the answer was produced — the generation ran to
      its end. Like vLLM, which aborts a request whose client disconnects, a request whose
      client left before that is not an execution ("executed once" is ``executions[key] == 1``);
    - `inflight`: model requests being answered now, per model.
    """

    __slots__ = (
        "disconnects",
        "executions",
        "held",
        "inflight",
        "open_requests",
        "open_streams",
        "received",
        "requests",
        "resets",
    )

    def __init__(self, routes: Iterable[str], models: Iterable[str]) -> None:
        self.requests = dict.fromkeys(routes, 0)
        self.inflight = dict.fromkeys(models, 0)
        self.received: dict[str, int] = {}
        self.executions: dict[str, int] = {}
        self.open_requests = 0
        self.held = 0
        self.open_streams = 0
        self.disconnects = 0
        self.resets = 0

    def __repr__(self) -> str:
        return (
            f"<ServerStats requests={sum(self.requests.values())} open={self.open_requests}"
            f" streams={self.open_streams} disconnects={self.disconnects} resets={self.resets}>"
        )

    def arrived(self, key: str) -> None:
        self.received[key] = self.received.get(key, 0) + 1

    def executed(self, key: str) -> None:
        self.executions[key] = self.executions.get(key, 0) + 1

    def opened(self, model: str, *, stream: bool) -> None:
        self.inflight[model] += 1
        self.open_requests += 1
        self.open_streams += stream

    def closed(self, model: str, *, stream: bool) -> None:
        self.inflight[model] -= 1
        self.open_requests -= 1
        self.open_streams -= stream

    def as_json(self) -> dict[str, object]:
        return {
            "requests": dict(self.requests),
            "open_requests": self.open_requests,
            "open_streams": self.open_streams,
            "held": self.held,
            "disconnects": self.disconnects,
            "resets": self.resets,
            "received": dict(self.received),
            "executions": dict(self.executions),
            "inflight": dict(self.inflight),
        }

    def exposition(self, max_running: int) -> str:
        """vLLM's gauges (per model, `engine="0"`) and the fleet's request counter, as text."""
        lines: list[str] = []
        running = {model: min(count, max_running) for model, count in self.inflight.items()}
        waiting = {model: count - running[model] for model, count in self.inflight.items()}
        usage = {m: (count / max_running if max_running else 1.0) for m, count in running.items()}
        for name, kind, text, values in (
            ("vllm:num_requests_running", "gauge", _RUNNING_HELP, running),
            ("vllm:num_requests_waiting", "gauge", _WAITING_HELP, waiting),
            ("vllm:kv_cache_usage_perc", "gauge", _KV_HELP, usage),
        ):
            lines += (f"# HELP {name} {text}", f"# TYPE {name} {kind}")
            lines += (
                f'{name}{{engine="0",model_name="{_escape(model)}"}} {float(value)!r}'
                for model, value in values.items()
            )
        lines += (
            "# HELP fleet_requests_total " + _REQUESTS_HELP,
            "# TYPE fleet_requests_total counter",
        )
        lines += (
            f'fleet_requests_total{{route="{_escape(route)}"}} {float(count)!r}'
            for route, count in self.requests.items()
        )
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
