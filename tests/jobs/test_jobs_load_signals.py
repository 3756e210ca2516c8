"""#14.2 on the job path: the ``upstream`` runtime sends through the same picker as the sync
path, so an upstream answering 429 fast does not attract the jobs while its peer is healthy."""

from __future__ import annotations

from jobs_rig import rig


async def test_a_fast_failing_upstream_does_not_fail_the_jobs_while_its_peer_is_healthy(
    dsn: str,
) -> None:
    """Before: 429 counted as a success and taught a 1 ms latency, so the 429 endpoint won every
    pick and 20/20 jobs failed CHAIN_EXHAUSTED. Now its 429 backs it off (the rig's clock does
    not move: it stays backed off), a call that met it goes on to the calm peer at once, and the
    peer runs every job."""
    async with rig(dsn, servers={"fast": ["qwen"], "peer": ["qwen"]}) as r:
        r.servers["fast"].update(fail_status=429)
        r.servers["peer"].update(delay_s=0.005)
        for i in range(20):
            await r.submit(f"j{i}")
        for _ in range(10):  # bounded: each round dispatches, lets the calls end, walks on
            await r.dispatcher.tick()
            await r.idle()
            await r.dispatcher.drain()
            states = [(await r.job(f"j{i}")).state for i in range(20)]
            if all(state in ("completed", "failed") for state in states):
                break
        fast = r.servers["fast"].stats.requests["/v1/chat/completions"]
        peer = r.servers["peer"].stats.requests["/v1/chat/completions"]
        failed = [i for i, state in enumerate(states) if state != "completed"]
        trail = await r.trail(f"j{failed[0]}") if failed else []
    assert ["completed"] * 20 == states, trail
    assert 20 == peer  # every job ran on the healthy peer
    assert fast < 20  # only the first wave (sent before its first 429 came back) tried it
