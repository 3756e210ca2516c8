from __future__ import annotations

import math

import pytest
from gpu_factories import dcgm_line, fixture_bytes

from gpugate.adapters.exposition import Sample, parse
from gpugate.core.gpu.dcgm import readings, require_gpus
from gpugate.errors import NoGpuSeries, ScrapeError

HTML = (
    b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n"
    b"<body><h1>502 Bad Gateway</h1><p>nginx</p></body></html>\n"
)


def test_a_sample_line_becomes_a_sample_with_its_name_labels_and_value() -> None:
    actual = parse('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="node-a"} 91\n')

    assert [Sample("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0", "Hostname": "node-a"}, 91.0)] == actual


def test_an_html_error_page_is_a_scrape_error() -> None:
    with pytest.raises(ScrapeError) as caught:
        parse(HTML)

    assert "SCRAPE_FAILED" == caught.value.code
    assert isinstance(caught.value.__cause__, ValueError)


def test_a_body_cut_in_the_middle_of_a_label_set_is_a_scrape_error() -> None:
    whole = "\n".join(
        [dcgm_line("DCGM_FI_DEV_GPU_TEMP", 40), dcgm_line("DCGM_FI_DEV_GPU_UTIL", 91)]
    )
    truncated = whole[: whole.rindex("modelName") + 12]

    with pytest.raises(ScrapeError):
        parse(truncated)


def test_bytes_that_are_not_utf8_are_a_scrape_error() -> None:
    with pytest.raises(ScrapeError):
        parse(b'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="\xff\xfe"} 1\n')


def test_a_timestamp_beyond_int64_milliseconds_is_a_scrape_error() -> None:
    with pytest.raises(ScrapeError) as caught:
        parse("DCGM_FI_DEV_GPU_UTIL 1 1" + "0" * 400 + "\n")

    assert "timestamp outside int64" in caught.value.message
    assert isinstance(caught.value.__cause__, ValueError)


def test_a_long_parser_complaint_is_shortened_in_the_message() -> None:
    with pytest.raises(ScrapeError) as caught:
        parse("x" * 5000 + "{\n")

    assert len(caught.value.message) < 200


def test_an_empty_body_is_zero_samples_and_no_gpus() -> None:
    samples = parse(b"")

    assert [] == samples
    with pytest.raises(NoGpuSeries) as caught:
        require_gpus(readings(samples))
    assert "SCRAPE_NO_GPUS" == caught.value.code


def test_a_metrics_page_without_dcgm_series_parses_but_holds_no_gpu() -> None:
    """A vLLM /metrics answering on the exporter's URL: counted as a failed scrape, not as data."""
    samples = parse(fixture_bytes("vllm-v1-k8sconf-kops-qwen2.5-0.5b-idle.prom"))

    assert samples
    assert [] == readings(samples)
    with pytest.raises(ScrapeError):  # NoGpuSeries is a ScrapeError: one except in the monitor
        require_gpus(readings(samples))


def test_a_counter_keeps_the_name_the_exporter_printed() -> None:
    """prometheus_client renames counter samples to end in _total; ours renames nothing."""
    text = (
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0"} 5551899580\n'
        "# TYPE DCGM_FI_DEV_XID_ERRORS counter\n"
        'DCGM_FI_DEV_XID_ERRORS{gpu="0"} 79\n'
        "# TYPE http_requests_total counter\n"
        'http_requests_total{code="200"} 3\n'
        "# TYPE requests counter\n"
        "requests 4\n"
    )

    names = [sample.name for sample in parse(text)]

    assert [
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_XID_ERRORS",
        "http_requests_total",
        "requests",
    ] == names


def test_sample_labels_are_read_only() -> None:
    (sample,) = parse('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 1\n')

    with pytest.raises(TypeError):
        sample.labels["gpu"] = "1"  # type: ignore[index]


def test_an_integer_beyond_a_double_is_an_infinity_not_an_error() -> None:
    (sample,) = parse("DCGM_FI_DEV_GPU_TEMP " + "1" + "0" * 400 + "\n")

    assert math.inf == sample.value


def test_a_line_with_fields_after_its_timestamp_is_a_scrape_error() -> None:
    with pytest.raises(ScrapeError):
        parse('DCGM_FI_DEV_GPU_TEMP{gpu="0"} 74 1700000000000 5\n')


def test_a_scrape_error_names_the_line() -> None:
    with pytest.raises(ScrapeError) as caught:
        parse('DCGM_FI_DEV_GPU_TEMP{gpu="0"} 74\nDCGM_FI_DEV_GPU_UTIL{gpu="0" 91\n')

    assert caught.value.message.startswith("not Prometheus text exposition: line 2 ")


def test_timestamps_are_dropped_and_values_are_floats() -> None:
    (sample,) = parse('DCGM_FI_DEV_GPU_TEMP{gpu="0"} 74 1700000000000\n')

    assert 74.0 == sample.value
    assert isinstance(sample.value, float)


def test_every_real_dcgm_scrape_parses() -> None:
    names = [
        "dcgm-exporter-aicr-eks-h100-8gpu-k8s-nohelp.prom",
        "dcgm-exporter-datadog-t4-stitched-throttle-unlabeled.prom",
        "dcgm-exporter-runai-a100-mig-4instances.prom",
    ]

    counts = [len(parse(fixture_bytes(name))) for name in names]

    assert [30, 38, 56] == counts
