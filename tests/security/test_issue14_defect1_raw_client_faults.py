"""Issue #14 defect 1: any client could eject a healthy upstream through ``/u/``.

The body was streamed upstream as it arrived, so an upload the client aborted, or a chunked body
over ``max_body_bytes``, broke the *upstream* request: 502 ``UPSTREAM_UNREACHABLE``, counted
against the endpoint's passive health — five of them ejected it for everyone, and the oversized
one answered 502 after ~10 MB had gone upstream. Now ``/u/`` receives and bounds the whole body
before admission: a client's fault is the client's (413, or nothing at all for a client that
left), and the upstream never sees it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from raw_rig import Rig, abort_upload, recording_upstream, send_chunked, send_raw

from gpugate.core import picking
from harness import eventually, make_config, serving, upstream

LIMIT = 64 * 1024


@pytest.fixture
async def rig(sqlite_dsn: str) -> AsyncIterator[Rig]:
    async with recording_upstream() as up:
        config = make_config(
            sqlite_dsn,
            [upstream("int", [up.url], ["m-int"])],
            server={"max_body_bytes": LIMIT},
        )
        async with serving(config) as gw:
            yield Rig(gw, up)


async def test_issue14_defect1_five_aborted_uploads_do_not_eject_the_upstream(rig: Rig) -> None:
    state = rig.gw.gateway.registry.upstream("int")
    for _ in range(5):
        await abort_upload(rig.gw.url, "/u/int/v1/files", declared=LIMIT, sent=LIMIT // 4)
    await eventually(lambda: state.pool.inflight == 0, what="the aborted uploads to end")
    endpoint = state.endpoints[0]
    now = rig.gw.gateway.clock.monotonic()
    assert (0, True) == (endpoint.failure_streak, picking.is_available(endpoint, now))
    assert (0, []) == (rig.up.bytes_received, rig.up.seen)
    after = await send_raw(rig.gw.url, "POST", "/u/int/v1/files", body=b"whole")
    assert (200, "int") == (after.status, after.headers.get("x-gateway-upstream"))


async def test_issue14_defect1_a_chunked_body_over_the_limit_is_413_and_never_reaches_upstream(
    rig: Rig,
) -> None:
    answer = await send_chunked(
        rig.gw.url, "/u/int/v1/files", chunk=b"y" * 16384, chunks=10 * LIMIT // 16384
    )
    assert (413, "PAYLOAD_TOO_LARGE") == (answer.status, answer.error_code())
    endpoint = rig.gw.gateway.registry.upstream("int").endpoints[0]
    assert (0, 0) == (rig.up.bytes_received, endpoint.failure_streak)


async def test_issue14_defect1_a_declared_length_over_the_limit_is_413_before_any_body(
    rig: Rig,
) -> None:
    answer = await send_raw(
        rig.gw.url, "PUT", "/u/int/v1/files", headers={"Content-Length": str(LIMIT + 1)}
    )
    assert (413, "PAYLOAD_TOO_LARGE") == (answer.status, answer.error_code())
    assert 0 == rig.up.bytes_received
