"""Engine scrapes → readings: vLLM's real /metrics, SGLang's and TEI's names, blanks, LoRA."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpugate.adapters import exposition
from gpugate.core import engine_metrics
from gpugate.errors import NoEngineSeries

VLLM_IDLE = (
    Path(__file__).parents[1]
    / "fixtures"
    / "metrics"
    / ("vllm-v1-k8sconf-kops-qwen2.5-0.5b-idle.prom")
)


def read(
    text: str,
    kind: engine_metrics.Kind | None = None,
    previous: engine_metrics.EngineReading | None = None,
) -> engine_metrics.EngineReading:
    return engine_metrics.reading(exposition.parse(text, engine_metrics.NAMES), kind, previous)


def vllm(running: float, waiting: float, kv: float, hits: float, queries: float) -> str:
    label = '{engine="0",model_name="m"}'
    return (
        f"vllm:num_requests_running{label} {running}\n"
        f"vllm:num_requests_waiting{label} {waiting}\n"
        f"vllm:kv_cache_usage_perc{label} {kv}\n"
        f"vllm:prefix_cache_hits_total{label} {hits}\n"
        f"vllm:prefix_cache_queries_total{label} {queries}\n"
    )


def test_the_real_idle_vllm_v1_scrape_reads_as_an_idle_vllm_engine() -> None:
    reading = read(VLLM_IDLE.read_text())

    assert ("vllm", 0.0, 0.0, 0.0) == (
        reading.kind,
        reading.running,
        reading.waiting,
        reading.kv_usage,
    )
    assert reading.prefix_hit_rate is None  # no query yet: unknown, not 0
    assert frozenset() == reading.loras


def test_the_hit_rate_is_the_share_of_queried_tokens_hit_since_the_previous_scrape() -> None:
    first = read(vllm(1, 0, 0.1, hits=100, queries=1000))
    second = read(vllm(1, 0, 0.1, hits=900, queries=2000), previous=first)

    assert 0.1 == first.prefix_hit_rate
    assert 0.8 == second.prefix_hit_rate


def test_counters_that_went_back_after_an_engine_restart_count_from_zero() -> None:
    before = read(vllm(0, 0, 0, hits=5000, queries=9000))
    after = read(vllm(0, 0, 0, hits=30, queries=60), previous=before)

    assert 0.5 == after.prefix_hit_rate


def test_data_parallel_ranks_are_summed_and_kv_use_averaged() -> None:
    text = (
        'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} 5\n'
        'vllm:num_requests_waiting{engine="0"} 1\nvllm:num_requests_waiting{engine="1"} 2\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.6\n'
    )
    reading = read(text)

    assert (8.0, 3.0) == (reading.running, reading.waiting)
    assert reading.kv_usage is not None
    assert math.isclose(0.4, reading.kv_usage)


def test_a_nan_value_is_missing_never_a_number() -> None:
    reading = read(vllm(2, 1, math.nan, 0, 0))

    assert reading.kv_usage is None
    assert (2.0, 1.0) == (reading.running, reading.waiting)


def test_lora_requests_info_gives_the_adapters_of_running_and_waiting_requests() -> None:
    text = vllm(1, 1, 0.1, 0, 0) + (
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",'
        'waiting_lora_adapters=""} 1.7e9\n'
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="",'
        'waiting_lora_adapters="old"} 1.6e9\n'
    )
    reading = read(text)

    assert frozenset({"sql", "chat"}) == reading.loras  # the newest sample only
    assert 4 == reading.max_lora


def test_sglang_and_tei_names_are_detected_and_read() -> None:
    sglang = read(
        'sglang:num_running_reqs{model_name="m"} 4\nsglang:num_queue_reqs{model_name="m"} 2\n'
        'sglang:token_usage{model_name="m"} 0.5\nsglang:cache_hit_rate{model_name="m"} 0.7\n'
    )
    tei = read("te_queue_size 3\nte_batch_current_size 7\n")

    assert ("sglang", 4.0, 2.0, 0.5, 0.7) == (
        sglang.kind,
        sglang.running,
        sglang.waiting,
        sglang.kv_usage,
        sglang.prefix_hit_rate,
    )
    assert ("tei", 7.0, 3.0, None) == (tei.kind, tei.running, tei.waiting, tei.kv_usage)


@pytest.mark.parametrize(
    "text",
    [
        "# a scrape of something else\nprocess_cpu_seconds_total 1.0\n",
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\n',  # vLLM, but no queue series
    ],
)
def test_a_scrape_without_engine_queue_series_is_refused(text: str) -> None:
    with pytest.raises(NoEngineSeries):
        read(text)


def test_a_named_kind_reads_only_that_engines_names() -> None:
    with pytest.raises(NoEngineSeries):
        read("te_queue_size 3\n", kind="vllm")
