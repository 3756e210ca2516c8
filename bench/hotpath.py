"""What every hot-path prototype does per request, whatever its server and client: the parts of
gpugate's request path that do not depend on the HTTP stack, so the prototypes differ only in it.

Per request: parse ``model`` and ``stream`` from the body (:data:`PARSERS`: the stdlib's
``json``, as gpugate today, ``orjson``, or a ``msgspec`` decoder that reads only those two
fields); choose an endpoint among the model's with gpugate's own picker (``core.picking``:
power of two choices, then ``claim``) and take a slot of its upstream's admission pool
(``core.admission``, gpugate's own); then, once the answer is relayed, release both, record the
endpoint's success and latency, count the request and observe its duration (:data:`METRICS`:
prometheus_client's ``Counter`` and ``Histogram`` children, as gpugate today, or plain
integers aggregated at scrape time).

Run by the prototypes with the candidates' venv (``venvs.CANDIDATES``), gpugate's ``src/`` on
``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpugate.clock import SystemClock
from gpugate.core import picking
from gpugate.core.admission import AdmissionPool, Slot
from gpugate.core.classes import RequestClass
from gpugate.core.picking import EndpointState

# As gpugate's adapters/upstream_client.py (not imported: that would load aiohttp, ~10 MB of
# resident memory, into prototypes that do not use it).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length"}
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Refused(Exception):
    """A request the prototype answers itself (bad body, unknown model, no slot)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code

    def body(self) -> bytes:
        return json.dumps({"error": {"message": str(self), "code": self.code}}).encode()


# -- the body: model and stream -----------------------------------------------------------------


def _check(doc: object) -> tuple[str, bool]:
    if not isinstance(doc, dict):
        raise Refused(400, "BAD_REQUEST", "the request body must be a JSON object")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise Refused(400, "BAD_REQUEST", "the request body needs a `model`")
    return model, doc.get("stream") is True


def parse_json(body: bytes) -> tuple[str, bool]:
    """gpugate today: the stdlib's json, the whole document."""
    try:
        return _check(json.loads(body))
    except ValueError as exc:
        raise Refused(400, "BAD_REQUEST", f"the request body is not valid JSON: {exc}") from exc


def _orjson() -> Callable[[bytes], tuple[str, bool]]:
    import orjson

    def parse(body: bytes) -> tuple[str, bool]:
        try:
            return _check(orjson.loads(body))
        except orjson.JSONDecodeError as exc:
            raise Refused(400, "BAD_REQUEST", f"the request body is not valid JSON: {exc}") from exc

    return parse


def _msgspec() -> Callable[[bytes], tuple[str, bool]]:
    """A decoder of only ``model`` and ``stream``: the rest of the document is validated as
    JSON and skipped, never built into Python objects."""
    import msgspec

    class Routing(msgspec.Struct):
        model: str
        stream: Any = False  # anything but `true` means "not streaming", as gpugate reads it

    decoder = msgspec.json.Decoder(Routing)

    def parse(body: bytes) -> tuple[str, bool]:
        try:
            doc = decoder.decode(body)
        except msgspec.ValidationError as exc:
            raise Refused(400, "BAD_REQUEST", f"the request body is not valid: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise Refused(400, "BAD_REQUEST", f"the request body is not valid JSON: {exc}") from exc
        if not doc.model:
            raise Refused(400, "BAD_REQUEST", "the request body needs a `model`")
        return doc.model, doc.stream is True

    return parse


PARSERS: dict[str, Callable[[], Callable[[bytes], tuple[str, bool]]]] = {
    "json": lambda: parse_json,
    "orjson": _orjson,
    "msgspec": _msgspec,
}


# -- metrics: a counter and a histogram per request ---------------------------------------------


class PromMetrics:
    """gpugate today: prometheus_client children, cached by labels."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "gateway_requests_total",
            "Requests",
            ["model", "upstream", "class", "code"],
            registry=self.registry,
        )
        self._duration = Histogram(
            "gateway_request_duration_seconds",
            "Duration",
            ["model", "class"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self._counted: dict[tuple[str, str, str, str], Any] = {}
        self._timed: dict[tuple[str, str], Any] = {}

    def record(self, model: str, upstream: str, cls: str, code: str, seconds: float) -> None:
        key = (model, upstream, cls, code)
        if (counter := self._counted.get(key)) is None:
            counter = self._counted[key] = self._requests.labels(*key)
        counter.inc()
        timed = (model, cls)
        if (timer := self._timed.get(timed)) is None:
            timer = self._timed[timed] = self._duration.labels(*timed)
        timer.observe(seconds)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))


class CheapMetrics:
    """Plain integers and lists on the hot path; the exposition text is built when scraped."""

    def __init__(self) -> None:
        self._requests: dict[tuple[str, str, str, str], int] = {}
        self._buckets: dict[tuple[str, str], list[float]] = {}  # per bucket, then sum, count

    def record(self, model: str, upstream: str, cls: str, code: str, seconds: float) -> None:
        key = (model, upstream, cls, code)
        self._requests[key] = self._requests.get(key, 0) + 1
        timed = (model, cls)
        if (row := self._buckets.get(timed)) is None:
            row = self._buckets[timed] = [0.0] * (len(DURATION_BUCKETS) + 3)
        row[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
        row[-2] += seconds
        row[-1] += 1

    def snapshot(self) -> dict[str, Any]:
        """The raw totals (what an aggregator across workers would merge)."""
        return {
            "requests": [[*k, v] for k, v in self._requests.items()],
            "durations": [[*k, row] for k, row in self._buckets.items()],
        }

    def render(self) -> bytes:
        lines = ["# TYPE gateway_requests_total counter"]
        for (model, upstream, cls, code), n in self._requests.items():
            labels = f'model="{model}",upstream="{upstream}",class="{cls}",code="{code}"'
            lines.append(f"gateway_requests_total{{{labels}}} {n}")
        lines.append("# TYPE gateway_request_duration_seconds histogram")
        for (model, cls), row in self._buckets.items():
            labels = f'model="{model}",class="{cls}"'
            running = 0.0
            for bound, n in zip((*DURATION_BUCKETS, "+Inf"), row, strict=False):
                running += n
                name = "gateway_request_duration_seconds_bucket"
                lines.append(f'{name}{{{labels},le="{bound}"}} {running:g}')
            lines.append(f"gateway_request_duration_seconds_sum{{{labels}}} {row[-2]}")
            lines.append(f"gateway_request_duration_seconds_count{{{labels}}} {row[-1]:g}")
        return ("\n".join(lines) + "\n").encode()


METRICS: dict[str, Callable[[], PromMetrics | CheapMetrics]] = {
    "prom": PromMetrics,
    "cheap": CheapMetrics,
}


# -- the fleet: models, endpoints, admission ----------------------------------------------------


@dataclass(slots=True)
class Upstream:
    id: str
    host: str
    port: int
    endpoint: EndpointState
    pool: AdmissionPool


@dataclass(slots=True)
class Pass:
    """One admitted request: where it goes and what it holds until it is finished."""

    upstream: Upstream
    slot: Slot
    probe: bool
    model: str
    started: float  # time.perf_counter() at receipt


class HotPath:
    """The per-request decisions and records, shared by every prototype."""

    def __init__(self, routes: dict[str, tuple[str, int]], parse: str, metrics: str) -> None:
        self.clock = SystemClock()
        self.rng = random.Random()
        self.parse = PARSERS[parse]()
        self.metrics = METRICS[metrics]()
        self.cls = RequestClass.INTERACTIVE.value
        self._by_model: dict[str, list[EndpointState]] = {}
        self._upstreams: dict[int, Upstream] = {}  # by id() of its endpoint
        for model, (host, port) in routes.items():
            url = f"http://{host}:{port}"
            ep = EndpointState(upstream_id=model, url=url)
            up = Upstream(model, host, port, ep, AdmissionPool(4096, 10000, self.clock))
            self._by_model[model] = [ep]
            self._upstreams[id(ep)] = up

    def upstreams(self) -> list[Upstream]:
        return list(self._upstreams.values())

    def admit(self, body: bytes, started: float) -> tuple[Pass, bool]:
        """Parse, pick, claim and take a slot: the request's :class:`Pass` and whether it
        streams. (Never a queue here: the pools are wide open, as gpugate's are in the bench.)"""
        model, stream = self.parse(body)
        endpoints = self._by_model.get(model)
        if endpoints is None:
            raise Refused(404, "UNKNOWN_MODEL", f"no upstream serves {model!r}")
        now = self.clock.monotonic()
        ep = picking.pick(endpoints, self.rng, now)
        up = self._upstreams[id(ep)]
        slot = up.pool.try_acquire()
        if slot is None:
            raise Refused(429, "QUEUE_FULL", "no admission slot")
        probe = picking.claim(ep, now)
        return Pass(up, slot, probe, model, started), stream

    def finish(self, p: Pass, status: int, ttfb_s: float) -> None:
        """Release the slot and the claim, record the outcome and the request."""
        ep = p.upstream.endpoint
        now = self.clock.monotonic()
        picking.release(ep, probe=p.probe)
        p.slot.release()
        if status >= 500:
            picking.record_failure(ep, now)
        else:
            picking.record_success(ep, now)
        picking.record_latency(ep, ttfb_s)
        elapsed = time.perf_counter() - p.started
        self.metrics.record(p.model, p.upstream.id, self.cls, str(status), elapsed)

    def abandon(self, p: Pass) -> None:
        """The client went away or the upstream failed: release, count a 499/502."""
        picking.release(p.upstream.endpoint, probe=p.probe)
        p.slot.release()
        elapsed = time.perf_counter() - p.started
        self.metrics.record(p.model, p.upstream.id, self.cls, "499", elapsed)


def upstream_head(
    method: bytes, path: bytes, headers: list[tuple[bytes, bytes]], up: Upstream, length: int
) -> bytes:
    """The request head for the upstream: the client's headers less hop-by-hop ones, the
    upstream's Host and the body's length (the body itself goes as the client sent it)."""
    lines = [method + b" " + path + b" HTTP/1.1", b"host: " + f"{up.host}:{up.port}".encode()]
    lines += [k + b": " + v for k, v in headers if k.lower() not in NOT_FORWARDED]
    lines.append(b"content-length: " + str(length).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


def arguments(description: str) -> argparse.ArgumentParser:
    """The arguments every prototype takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--route", action="append", required=True, help="MODEL=HOST:PORT")
    parser.add_argument("--parse", choices=sorted(PARSERS), default="json")
    parser.add_argument("--metrics", choices=sorted(METRICS), default="prom")
    return parser


def routes_of(args: argparse.Namespace) -> dict[str, tuple[str, int]]:
    out = {}
    for route in args.route:
        model, _, where = route.partition("=")
        host, _, port = where.rpartition(":")
        out[model] = (host, int(port))
    return out
