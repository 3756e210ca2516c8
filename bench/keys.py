"""Client-key limits across replicas (issue #16, Done-when 2): accuracy and cost per request.

    python bench/keys.py                      # ~5 min: 2 min limited run, budget run, cost runs
    python bench/keys.py --duration 30        # shorter

Two ``gpugate serve`` replicas on one fresh PostgreSQL schema (``GPUGATE_BENCH_POSTGRES``, else
the local default), the simulated fleet's model server, one key, closed-loop clients split
across both replicas (the rig of ``tests/identity/keys_rig.py``). Printed:

1. **Accuracy.** A key at 600 requests/min and 60,000 tokens/min (100-word prompts: the tokens
   bind first) for ``--duration`` seconds: per UTC minute, the settled requests and tokens in the
   store (``key_counters``) and their share of the limit — never over 100 % by construction,
   the criterion is 110 % — and how close to the limit a fully covered minute got (undershoot).
2. **Budget.** A key with ``daily_cents`` under 50 concurrent requests: what was spent against
   the budget, in cents and in requests' worth.
3. **Cost per request** (same run, same load): a key with no limits (the key lookup only) and a
   key with rpm, tpm and daily-token limits (leased from PostgreSQL in slices),
   each against ``auth.mode: open`` measured on a second replica of the same store; req/s and
   p50/p99 latency, and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

import aiohttp
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "identity"))

from keys_rig import (
    KeyedReplica,
    Tally,
    counters,
    create_key,
    drive,
    prompt_of,
    replicas,
)

from gpugate.fleet import ModelServer

POSTGRES = os.environ.get("GPUGATE_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
RPM, TPM = 600, 60_000
PRICE = "models:\n  - name: m\n    price: {prompt_per_1k_cents: 10, completion_per_1k_cents: 20}\n"


async def fresh_schema() -> tuple[str, str]:
    schema = f"bench_keys_{secrets.token_hex(4)}"
    async with await psycopg.AsyncConnection.connect(POSTGRES, autocommit=True) as conn:
        await conn.execute(f"CREATE SCHEMA {schema}")
    joiner = "&" if "?" in POSTGRES else "?"
    return schema, f"{POSTGRES}{joiner}options={quote(f'-csearch_path={schema}', safe='')}"


async def drop_schema(schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(POSTGRES, autocommit=True) as conn:
        await conn.execute(f"DROP SCHEMA {schema} CASCADE")


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(name: str, tally: Tally, seconds: float) -> str:
    rps = tally.accepted / seconds
    p50 = quantile(tally.latencies, 0.5) * 1000
    p99 = quantile(tally.latencies, 0.99) * 1000
    return f"{name:<28} {rps:8.1f} req/s   p50 {p50:6.2f} ms   p99 {p99:6.2f} ms"


async def accuracy(
    http: aiohttp.ClientSession, workdir: Path, upstream: str, seconds: float
) -> None:
    schema, dsn = await fresh_schema()
    try:
        async with replicas(workdir / "acc", dsn, upstream, http) as (a, b):
            key = await create_key(
                http, a.url, limits={"requests_per_min": RPM, "tokens_per_min": TPM}
            )
            tally = await drive(
                http, [a.url, b.url], key["key"], seconds=seconds, workers=16, body=prompt_of(100)
            )
        spans = await counters(dsn, key["id"])
    finally:
        await drop_schema(schema)
    print(f"\n1. accuracy: one key at {RPM} rpm / {TPM} tpm, 2 replicas, {seconds:.0f} s")
    print(f"   clients: {dict(tally.codes)}; served by replica: {list(tally.by_replica.values())}")
    worst = 0.0
    for span, (requests, tokens, _) in sorted(spans.items()):
        if not span.startswith("m:"):
            continue
        share_r, share_t = requests / RPM, tokens / TPM
        worst = max(worst, share_r, share_t)
        print(
            f"   {span[2:]}  requests {requests:5d} ({share_r:6.1%})  tokens {tokens:6d} "
            f"({share_t:6.1%})"
        )
    leased_r = sum(r for s, (r, _, _) in spans.items() if s.startswith("m:"))
    leased_t = sum(t for s, (_, t, _) in spans.items() if s.startswith("m:"))
    print(f"   leased (store), highest share of a limit in any minute: {worst:.1%} (<= 110 %)")
    print(
        f"   served (clients): {tally.accepted} requests, {tally.tokens} tokens = "
        f"{tally.accepted / leased_r:.1%} / {tally.tokens / leased_t:.1%} of what was leased"
    )


async def budget(http: aiohttp.ClientSession, workdir: Path, upstream: str) -> None:
    schema, dsn = await fresh_schema()
    cents = 50.0
    try:
        async with replicas(workdir / "bud", dsn, upstream, http, models=PRICE) as (a, b):
            key = await create_key(http, a.url, limits={"daily_cents": cents})
            tally = await drive(
                http, [a.url, b.url], key["key"], seconds=15, workers=50, body=prompt_of(100)
            )
        spans = await counters(dsn, key["id"])
    finally:
        await drop_schema(schema)
    (leased,) = [c for s, (_, _, c) in spans.items() if s.startswith("d:")]
    spent = (tally.prompt * 10 + tally.completion * 20) / 1000  # the price above
    one = (100 * 10 + 8 * 20) / 1000  # 100 prompt words, 8 completion chunks
    print(f"\n2. budget: daily_cents {cents} under 50 concurrent requests, 2 replicas")
    print(f"   clients: {dict(tally.codes)}")
    print(
        f"   spent (served usage x price) {spent:.4f} cents = {spent / cents:.2%} of the budget;"
        f" over by {max(0.0, spent - cents) / one:.2f} requests' worth (criterion: <= 1);"
        f" leased {leased:.4f}"
    )


async def cost(http: aiohttp.ClientSession, workdir: Path, upstream: str, seconds: float) -> None:
    schema, dsn = await fresh_schema()
    body = prompt_of(10)
    try:
        async with replicas(workdir / "cost", dsn, upstream, http, count=1) as (keyed,):
            free = await create_key(http, keyed.url, name="free")
            big = 10**9
            limited = await create_key(
                http,
                keyed.url,
                name="limited",
                limits={"requests_per_min": big, "tokens_per_min": big, "daily_tokens": big},
            )
            open_replica = KeyedReplica(workdir / "cost", "open", dsn, upstream)
            open_replica.config.write_text(
                open_replica.config.read_text().replace("auth: {mode: keys}", "auth: {mode: open}")
            )
            await open_replica.start(http)
            try:
                results = []
                for _ in range(2):  # interleaved, twice: the machine's noise hits each alike
                    for name, url, secret in (
                        ("open", open_replica.url, "unused"),
                        ("keys, no limits", keyed.url, free["key"]),
                        ("keys, with limits", keyed.url, limited["key"]),
                    ):
                        tally = await drive(
                            http, [url], secret, seconds=seconds, workers=8, body=body
                        )
                        results.append((name, tally))
            finally:
                await open_replica.stop()
    finally:
        await drop_schema(schema)
    print(f"\n3. cost per request: one replica each, 8 closed-loop clients, 2 x {seconds:.0f} s")
    rates: dict[str, list[float]] = {}
    for name, tally in results:
        print("   " + summary(name, tally, seconds))
        rates.setdefault(name, []).append(tally.accepted / seconds)
    base = statistics.mean(rates["open"])
    for name in ("keys, no limits", "keys, with limits"):
        print(f"   {name}: {statistics.mean(rates[name]) / base:.1%} of open's req/s")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=120.0, help="accuracy run, seconds")
    parser.add_argument("--cost-s", type=float, default=10.0, help="each cost run, seconds")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gpugate-bench-keys-"))
    for part in ("acc", "bud", "cost"):
        (workdir / part).mkdir()
    print(f"bench/keys.py: PostgreSQL {POSTGRES.split('@')[-1]}, logs in {workdir}")
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        ModelServer(["m"], name="u") as server,
        aiohttp.ClientSession(timeout=timeout, connector=connector) as http,
    ):
        await accuracy(http, workdir, server.url, args.duration)
        await budget(http, workdir, server.url)
        await cost(http, workdir, server.url, args.cost_s)


if __name__ == "__main__":
    asyncio.run(main())
