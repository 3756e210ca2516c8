"""Finding 8 (issue #15), the parts still open on main: upstream URLs reached clients (in error
bodies, job errors) and the open ``/metrics`` (``gateway_endpoint_healthy``'s ``endpoint``
label), and headers a ``Connection`` header names were forwarded. Now an error names the
upstream's id (and the endpoint's index when it has several), the metric labels the endpoint by
its index in ``urls``, and ``Connection``-named fields are dropped both ways (RFC 9110 §7.6.1)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from raw_rig import recording_upstream, send_raw

from gpugate.listen import bind
from harness import make_config, serving, upstream


def closed_port_url() -> str:
    """A loopback URL nothing listens on (the port was bound, then released)."""
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/secret-base"


async def metrics_once_probed(http: aiohttp.ClientSession, url: str) -> str:
    """``/metrics`` once the prober has published ``gateway_endpoint_healthy`` (bounded)."""
    async with asyncio.timeout(10):
        while True:
            async with http.get(url + "/metrics") as resp:
                text = await resp.text()
            if "gateway_endpoint_healthy{" in text:
                return text
            await asyncio.sleep(0.05)


async def test_finding8_errors_jobs_and_metrics_name_the_upstream_not_its_url(
    sqlite_dsn: str,
) -> None:
    dead = closed_port_url()
    config = make_config(sqlite_dsn, [upstream("gone", [dead, dead + "2"], ["m1"])])
    chat = {"model": "m1", "messages": [{"role": "user", "content": "x"}]}
    async with serving(config, probe_interval_s=0.05) as gw, aiohttp.ClientSession() as http:
        async with http.post(gw.v1 + "/chat/completions", json=chat) as resp:
            status, error = resp.status, await resp.text()
        job = {"model": "m1", "input": {"messages": chat["messages"]}}
        async with http.post(gw.v1 + "/jobs?wait=10", json=job) as resp:
            job_answer = await resp.text()
        probed = await metrics_once_probed(http, gw.url)
    leaked = [t for t in (error, job_answer, probed) if "127.0.0.1" in t or "secret-base" in t]
    assert [] == leaked
    assert (502, True) == (status, "'gone'" in json.loads(error)["error"]["message"])
    endpoints = {
        sample.labels["endpoint"]
        for family in text_string_to_metric_families(probed)
        for sample in family.samples
        if sample.name == "gateway_endpoint_healthy"
    }
    assert {"0", "1"} == endpoints


async def test_finding8_headers_named_in_connection_are_not_forwarded(sqlite_dsn: str) -> None:
    async with recording_upstream() as up:
        config = make_config(sqlite_dsn, [upstream("int", [up.url], ["m1"])])
        async with serving(config) as gw:
            answer = await send_raw(
                gw.url,
                "GET",
                "/u/int/v1/models",
                headers={"Connection": "keep-alive, X-Hop-Secret", "X-Hop-Secret": "s3cr3t"},
            )
    assert 200 == answer.status
    sent = {name.lower() for name in up.seen[0].headers}
    assert "x-hop-secret" not in sent
