"""``/metrics`` is one view across the workers of ``serve --workers``: the merge's rules, and
the real command, whichever worker answers the scrape."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpugate.fleet import ModelServer, ServerBehaviour
from gpugate.metrics import Metrics, merge
from harness import eventually, make_config, upstream
from workers.processes import children, established_on, serve_process

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _merged(*registries: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    families = merge([m.snapshot() for m in registries])
    return _samples(generate_latest(_Families(families)).decode())


def test_one_workers_merge_is_its_own_exposition_byte_for_byte() -> None:
    metrics = Metrics()
    metrics.requests.labels("m", "up", "interactive", "200").inc(3)
    metrics.request_duration.labels("m", "interactive").observe(0.2)
    metrics.endpoint_healthy.labels("up", "0").set(1)
    assert metrics.render() == generate_latest(_Families(merge([metrics.snapshot()])))


def test_counters_and_histograms_are_summed_and_created_is_the_earliest() -> None:
    a, b = Metrics(), Metrics()
    a.requests.labels("m", "up", "interactive", "200").inc(3)
    b.requests.labels("m", "up", "interactive", "200").inc(4)
    b.requests.labels("m", "up", "batch", "503").inc()
    a.request_duration.labels("m", "interactive").observe(0.2)
    b.request_duration.labels("m", "interactive").observe(7)
    merged = _merged(a, b)
    ok = frozenset({"model": "m", "upstream": "up", "class": "interactive", "code": "200"}.items())
    assert 7 == merged[("gateway_requests_total", ok)]
    batch = frozenset({"model": "m", "upstream": "up", "class": "batch", "code": "503"}.items())
    assert 1 == merged[("gateway_requests_total", batch)]
    labels = {"model": "m", "class": "interactive"}
    assert 2 == merged[("gateway_request_duration_seconds_count", frozenset(labels.items()))]
    assert 7.2 == merged[("gateway_request_duration_seconds_sum", frozenset(labels.items()))]
    le_1 = frozenset({**labels, "le": "1.0"}.items())
    assert 1 == merged[("gateway_request_duration_seconds_bucket", le_1)]
    created = [_samples(m.render().decode())[("gateway_requests_created", ok)] for m in (a, b)]
    assert min(created) == merged[("gateway_requests_created", ok)]


def test_gauges_merge_by_meaning_in_flight_summed_health_only_when_every_worker_agrees() -> None:
    a, b = Metrics(), Metrics()
    a.upstream_inflight.labels("up").set(2)
    b.upstream_inflight.labels("up").set(5)
    a.endpoint_healthy.labels("up", "0").set(1)
    b.endpoint_healthy.labels("up", "0").set(0)  # ejected by this worker's passive health
    a.gpu_faulted.labels("h", "0", "e").set(0)
    b.gpu_faulted.labels("h", "0", "e").set(1)  # this worker's verdict came first
    a.config_version.set(3)
    b.config_version.set(3)
    merged = _merged(a, b)
    assert 7 == merged[("gateway_upstream_inflight", frozenset({"upstream": "up"}.items()))]
    endpoint = frozenset({"upstream": "up", "endpoint": "0"}.items())
    assert 0 == merged[("gateway_endpoint_healthy", endpoint)]
    gpu = frozenset({"host": "h", "gpu": "0", "instance": "e"}.items())
    assert 1 == merged[("gateway_gpu_faulted", gpu)]
    assert 3 == merged[("gateway_config_version", frozenset())]
    assert 1 == merged[("gateway_build_info", frozenset({"version": a_version()}.items()))]


def a_version() -> str:
    from gpugate import __version__

    return __version__


def _holder(workers: list[int], port: int) -> int:
    """The worker that holds the one open client connection on ``port``."""
    holders = [pid for pid in workers if established_on(pid, port)]
    assert 1 == len(holders), holders
    return holders[0]


async def test_n_requests_are_counted_n_times_whichever_of_two_workers_answers_the_scrape(
    sqlite_dsn: str,
) -> None:
    requests = 40
    async with ModelServer(["m"], name="up") as up:
        config = make_config(sqlite_dsn, [upstream("up", [up.url], ["m"])])
        async with serve_process(config, workers=2) as (url, proc, _log):
            workers, port = children(proc.pid), int(url.rsplit(":", 1)[1])
            served_by = []
            for _ in range(requests):  # a fresh connection each: the kernel spreads them
                async with aiohttp.ClientSession() as http:
                    async with http.post(url + "/v1/chat/completions", json=CHAT) as response:
                        assert 200 == response.status
                    served_by.append(_holder(workers, port))
            assert set(workers) == set(served_by), "one worker served every request"
            counted: dict[int, set[float]] = {pid: set() for pid in workers}
            for _ in range(40):  # fresh connections until both workers have answered scrapes
                async with aiohttp.ClientSession() as http:
                    async with http.get(url + "/metrics") as response:
                        samples = _samples(await response.text())
                    counted[_holder(workers, port)].add(
                        sum(
                            value
                            for (name, labels), value in samples.items()
                            if name == "gateway_requests_total" and ("code", "200") in labels
                        )
                    )
                assert 2 == samples[("gateway_workers_reporting", frozenset())]
                if all(counted.values()):
                    break
            assert {pid: {requests} for pid in workers} == counted


async def test_two_workers_share_out_max_inflight_so_the_upstream_sees_what_is_configured(
    sqlite_dsn: str,
) -> None:
    """max_inflight 4 with two workers: each admits 2, so 12 slow requests over both reach the
    upstream 4 at a time, as with one process (the rest wait in the workers' queues)."""
    async with ModelServer(["m"], name="slow", behaviour=ServerBehaviour(delay_s=1.0)) as slow:
        config = make_config(sqlite_dsn, [upstream("slow", [slow.url], ["m"], max_inflight=4)])
        async with serve_process(config, workers=2) as (url, proc, _log):
            workers, port = children(proc.pid), int(url.rsplit(":", 1)[1])
            sessions = [aiohttp.ClientSession() for _ in range(12)]
            peak = 0
            try:
                requests = [
                    asyncio.ensure_future(s.post(url + "/v1/chat/completions", json=CHAT))
                    for s in sessions
                ]
                await eventually(lambda: slow.stats.open_requests > 0, what="a request upstream")
                held = [established_on(pid, port) for pid in workers]
                assert all(count > 0 for count in held), f"connections per worker: {held}"
                async with asyncio.timeout(30):  # 3 s of work; a hang fails here
                    while not all(r.done() for r in requests):  # sample the upstream's count
                        peak = max(peak, slow.stats.open_requests)
                        await asyncio.sleep(0.005)
                assert [200] * 12 == [r.result().status for r in requests]
            finally:
                for session in sessions:
                    await session.close()
            assert 4 == peak
