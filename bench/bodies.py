"""What the edge's checks cost: ``web.bodies.json_document`` (parse + the iterative walk for
depth, finite numbers and storable text) against a bare ``json.loads`` of the same bytes, and
``read_yaml`` of an alias bomb against an ordinary config, in one run.

    python bench/bodies.py            # ~10 s
    python bench/bodies.py --quick    # ~2 s

Prints microseconds per document and the ratio to the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import time
import timeit
from collections.abc import Callable
from itertools import pairwise

import yaml

from gpugate.config.source_map import read_yaml
from gpugate.errors import ConfigError
from gpugate.web.bodies import json_document


def chat(words: int, tools: int = 0) -> bytes:
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
            },
        },
    }
    body = {
        "model": "qwen-35b",
        "stream": False,
        "temperature": 0.7,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": " ".join(["token"] * words)},
        ],
        "tools": [tool] * tools,
    }
    return json.dumps(body).encode()


BODIES: dict[str, bytes] = {
    "chat, 1 KB": chat(150),
    "chat + 20 tools, 10 KB": chat(200, tools=20),
    "chat, 100 KB context": chat(16_000),
    "embeddings, 256 inputs": json.dumps(
        {"model": "bge-m3", "input": [f"sentence number {i} of the batch" for i in range(256)]}
    ).encode(),
}


ROUNDS = 7


def per_call_us(
    baseline: Callable[[], object], measured: Callable[[], object], seconds: float
) -> tuple[float, float]:
    """CPU microseconds per call of each (this process's CPU time, so a busy machine's waits do
    not count), the best of ROUNDS rounds that alternate between them."""
    slower = max(timeit.timeit(baseline, number=3), timeit.timeit(measured, number=3)) / 3
    number = max(1, int(seconds / (2 * ROUNDS) / max(slower, 1e-7)))
    best = [float("inf"), float("inf")]
    for _ in range(ROUNDS):
        for index, call in enumerate((baseline, measured)):
            spent = timeit.timeit(call, number=number, timer=time.process_time)
            best[index] = min(best[index], spent / number * 1e6)
    return best[0], best[1]


def alias_bomb() -> str:
    lines = ["a: &a [" + ", ".join(["lol"] * 9) + "]"]
    names = "abcdefghi"
    lines += [f"{n}: &{n} [" + ", ".join([f"*{b}"] * 9) + "]" for b, n in pairwise(names)]
    return "\n".join(lines) + "\n"


def refused(text: str) -> None:
    try:
        read_yaml(text)
    except ConfigError:
        return
    raise AssertionError("the alias bomb was read")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    budget = 0.4 if parser.parse_args().quick else 2.0

    print(f"{'body':<26} {'bytes':>8} {'json.loads µs':>14} {'json_document µs':>17} {'ratio':>6}")
    for name, raw in BODIES.items():
        bare, edge = per_call_us(
            lambda raw=raw: json.loads(raw), lambda raw=raw: json_document(raw), budget
        )
        print(f"{name:<26} {len(raw):>8} {bare:>14.1f} {edge:>17.1f} {edge / bare:>6.2f}")

    config = yaml.safe_dump(
        {
            "upstreams": [
                {"id": f"u{i}", "url": f"http://127.0.0.1:{8000 + i}", "models": [f"m{i}"]}
                for i in range(50)
            ]
        }
    )
    bomb = alias_bomb()
    ordinary, refusal = per_call_us(lambda: read_yaml(config), lambda: refused(bomb), budget)
    print(f"\n{'YAML':<40} {'bytes':>8} {'µs':>10}")
    print(f"{'config of 50 upstreams (read)':<40} {len(config):>8} {ordinary:>10.1f}")
    print(f"{'alias bomb, 9**9 values (refused)':<40} {len(bomb):>8} {refusal:>10.1f}")
    print(f"ratio bomb / ordinary config: {refusal / ordinary:.3f}")


if __name__ == "__main__":
    main()
