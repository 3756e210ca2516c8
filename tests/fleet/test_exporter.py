"""The fake dcgm-exporter speaks the real exposition format, and each control changes it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpugate.fleet import ControlError, FakeExporter, xid_message

Until = Callable[[Callable[[], bool]], Awaitable[None]]
Sample = dict[str, Any]


async def scrape_text(http: aiohttp.ClientSession, exporter: FakeExporter) -> str:
    async with http.get(exporter.metrics_url) as response:
        assert 200 == response.status
        return await response.text()


async def scrape(http: aiohttp.ClientSession, exporter: FakeExporter) -> dict[str, list[Sample]]:
    """Family name -> its samples as {"labels": ..., "value": ...}, parsed by prometheus_client."""
    families = text_string_to_metric_families(await scrape_text(http, exporter))
    return {
        family.name: [{"labels": s.labels, "value": s.value} for s in family.samples]
        for family in families
    }


def value(families: dict[str, list[Sample]], name: str, gpu: str) -> float:
    (sample,) = [s for s in families[name] if s["labels"]["gpu"] == gpu]
    return float(sample["value"])


def labels(families: dict[str, list[Sample]], name: str, gpu: str) -> dict[str, str]:
    (sample,) = [s for s in families[name] if s["labels"]["gpu"] == gpu]
    return dict(sample["labels"])


async def control(
    http: aiohttp.ClientSession, exporter: FakeExporter, path: str, body: dict[str, Any]
) -> int:
    async with http.post(f"{exporter.url}/_control{path}", json=body) as response:
        await response.read()
        return response.status


async def test_a_scrape_parses_with_help_and_type_and_one_sample_per_gpu(
    exporter: FakeExporter, http: aiohttp.ClientSession
) -> None:
    text = await scrape_text(http, exporter)
    families = {f.name: f for f in text_string_to_metric_families(text)}

    assert "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n" in text
    assert "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" in text
    assert "gauge" == families["DCGM_FI_DEV_GPU_TEMP"].type
    for name in (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    ):
        assert ["0", "1"] == [s.labels["gpu"] for s in families[name].samples], name


async def test_every_sample_carries_the_real_label_set(
    exporter: FakeExporter, http: aiohttp.ClientSession
) -> None:
    shown = labels(await scrape(http, exporter), "DCGM_FI_DEV_GPU_TEMP", "1")

    assert {
        "gpu",
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "Hostname",
        "DCGM_FI_DRIVER_VERSION",
    } == set(shown)
    assert "nvidia1" == shown["device"]
    assert "node-a" == shown["Hostname"]
    assert shown["UUID"].startswith("GPU-")


async def test_util_control_changes_the_util_of_that_gpu_only(
    exporter: FakeExporter, http: aiohttp.ClientSession
) -> None:
    assert 200 == await control(http, exporter, "/gpus/1", {"util": 97})

    families = await scrape(http, exporter)

    assert (0.0, 97.0) == (
        value(families, "DCGM_FI_DEV_GPU_UTIL", "0"),
        value(families, "DCGM_FI_DEV_GPU_UTIL", "1"),
    )


async def test_temp_control_changes_the_gpu_temperature(
    exporter: FakeExporter, http: aiohttp.ClientSession
) -> None:
    await control(http, exporter, "/gpus/0", {"temp": 93})

    assert 93.0 == value(await scrape(http, exporter), "DCGM_FI_DEV_GPU_TEMP", "0")


async def test_xid_control_sets_the_sticky_last_xid_with_its_code_and_message(
    exporter: FakeExporter, http: aiohttp.ClientSession
) -> None:
    await control(http, exporter, "/gpus/0", {"xid": 79})

    first = await scrape(http, exporter)
    second = await scrape(http, exporter)

    for families in (first, second):
        assert 79.0 == value(families, "DCGM_FI_DEV_XID_ERRORS", "0")
        shown = labels(families, "DCGM_FI_DEV_XID_ERRORS", "0")
        assert ("79", "GPU has fallen off the bus") == (shown["err_code"], shown["err_msg"])
    assert "No Error" == labels(first, "DCGM_FI_DEV_XID_ERRORS", "1")["err_msg"]


def test_xids_outside_the_table_read_unknown_error() -> None:
    assert ("Uncontained ECC error", "Unknown Error") == (xid_message(95), xid_message(4242))


async def test_each_xid_bumps_the_windowed_count_series(
    exporter: FakeExporter, http: aiohttp.ClientSession
) -> None:
    await control(http, exporter, "/gpus/0", {"xid": 48})
    await control(http, exporter, "/gpus/0", {"xid": 48})
    await control(http, exporter, "/gpus/0", {"xid": 31})

    counts = {
        (s["labels"]["gpu"], s["labels"].get("xid")): s["value"]
        for s in (await scrape(http, exporter))["DCGM_EXP_XID_ERRORS_COUNT"]
    }

    assert {("0", "31"): 1.0, ("0", "48"): 2.0, ("1", None): 0.0} == counts


async def test_xid_counts_leave_the_window_when_they_age_out(until: Until) -> None:
    exporter = FakeExporter(1, counters={"DCGM_EXP_XID_ERRORS_COUNT"}, xid_window_s=0.2)
    exporter.set_gpu(0, xid=94)
    assert 'xid="94"} 1' in exporter.exposition()

    await until(lambda: 'xid="94"' not in exporter.exposition())


async def test_clock_reasons_control_sets_the_bitmask(
    exporter: FakeExporter, http: aiohttp.ClientSession
) -> None:
    idle = value(await scrape(http, exporter), "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "0")
    await control(http, exporter, "/gpus/0", {"clock_reasons": 0x40 | 0x08})

    hot = value(await scrape(http, exporter), "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "0")

    assert (1.0, 72.0) == (idle, hot)  # an idle GPU reports GPU_IDLE, then HW_THERMAL|HW_SLOWDOWN


async def test_row_remap_failure_control_sets_the_flag(
    exporter: FakeExporter, http: aiohttp.ClientSession
) -> None:
    await control(http, exporter, "/gpus/1", {"row_remap_failure": 1})

    assert 1.0 == value(await scrape(http, exporter), "DCGM_FI_DEV_ROW_REMAP_FAILURE", "1")


async def test_health_control_sets_the_health_status_series(
    exporter: FakeExporter, http: aiohttp.ClientSession
) -> None:
    await control(http, exporter, "/gpus/0", {"health": 20})

    families = await scrape(http, exporter)

    assert 20.0 == value(families, "DCGM_EXP_GPU_HEALTH_STATUS", "0")
    assert "ALL" == labels(families, "DCGM_EXP_GPU_HEALTH_STATUS", "0")["health_watch"]
    assert 0.0 == value(families, "DCGM_EXP_GPU_HEALTH_STATUS", "1")


async def test_restart_puts_every_last_xid_back_to_zero_and_empties_the_counts(
    exporter: FakeExporter, http: aiohttp.ClientSession
) -> None:
    await control(http, exporter, "/gpus/0", {"xid": 79, "util": 50})

    assert 200 == await control(http, exporter, "/restart", {})
    families = await scrape(http, exporter)

    assert 0.0 == value(families, "DCGM_FI_DEV_XID_ERRORS", "0")
    assert "No Error" == labels(families, "DCGM_FI_DEV_XID_ERRORS", "0")["err_msg"]
    assert 50.0 == value(families, "DCGM_FI_DEV_GPU_UTIL", "0")
    assert "xid" not in labels(families, "DCGM_EXP_XID_ERRORS_COUNT", "0")


async def test_the_xid_series_is_absent_when_not_emitted(http: aiohttp.ClientSession) -> None:
    async with FakeExporter(2, emit_xid=False) as exporter:
        families = await scrape(http, exporter)
        exporter.set_gpu(1, emit_xid=True)
        later = await scrape(http, exporter)

    assert "DCGM_FI_DEV_XID_ERRORS" not in families
    assert ["1"] == [s["labels"]["gpu"] for s in later["DCGM_FI_DEV_XID_ERRORS"]]


async def test_the_host_label_can_be_lower_case_hostname(http: aiohttp.ClientSession) -> None:
    async with FakeExporter(1, hostname="node-b", host_label="hostname") as exporter:
        shown = labels(await scrape(http, exporter), "DCGM_FI_DEV_GPU_UTIL", "0")

    assert "node-b" == shown["hostname"]
    assert "Hostname" not in shown


async def test_optional_series_appear_only_when_named_in_counters(
    http: aiohttp.ClientSession,
) -> None:
    async with FakeExporter(1, counters={"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"}) as exporter:
        names = set(await scrape(http, exporter))

    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" in names
    assert not names & {
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_EXP_XID_ERRORS_COUNT",
        "DCGM_EXP_GPU_HEALTH_STATUS",
    }


async def test_down_mode_answers_503(exporter: FakeExporter, http: aiohttp.ClientSession) -> None:
    await control(http, exporter, "", {"mode": "down"})

    async with http.get(exporter.metrics_url) as response:
        assert 503 == response.status


async def test_garbage_mode_answers_200_with_text_that_is_not_an_exposition(
    exporter: FakeExporter, http: aiohttp.ClientSession
) -> None:
    await control(http, exporter, "", {"mode": "garbage"})

    text = await scrape_text(http, exporter)

    assert "DCGM_" not in text
    with pytest.raises(ValueError, match="invalid metric name"):
        list(text_string_to_metric_families(text))


async def test_truncated_mode_cuts_the_body_inside_a_sample_line(
    exporter: FakeExporter, http: aiohttp.ClientSession
) -> None:
    whole = await scrape_text(http, exporter)
    await control(http, exporter, "", {"mode": "truncated"})

    cut = await scrape_text(http, exporter)

    last_line = cut.rsplit("\n", 1)[-1]
    assert len(cut) < len(whole)
    assert last_line.startswith("DCGM_FI_")
    assert "{" in last_line
    assert "}" not in last_line
    with pytest.raises(ValueError):  # noqa: PT011 - the parser says only ValueError
        list(text_string_to_metric_families(cut))


async def test_reset_mode_breaks_the_connection_mid_body(
    exporter: FakeExporter, http: aiohttp.ClientSession
) -> None:
    exporter.set_mode("reset")

    async with http.get(exporter.metrics_url) as response:
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()


async def test_hang_mode_outlasts_a_client_timeout(
    exporter: FakeExporter, http: aiohttp.ClientSession
) -> None:
    await control(http, exporter, "", {"mode": "hang"})

    with pytest.raises(TimeoutError):
        async with http.get(exporter.metrics_url, timeout=aiohttp.ClientTimeout(total=0.3)):
            pass


async def test_a_hung_scrape_is_answered_when_the_mode_goes_back_to_normal(
    exporter: FakeExporter, http: aiohttp.ClientSession, until: Until
) -> None:
    exporter.set_mode("hang")
    held = asyncio.create_task(scrape_text(http, exporter))
    await until(lambda: exporter.scrapes == 1)

    exporter.set_mode("normal")

    assert "DCGM_FI_DEV_GPU_UTIL" in await held


async def test_control_state_and_stats_show_mode_gpus_and_scrapes(
    exporter: FakeExporter, http: aiohttp.ClientSession
) -> None:
    await scrape_text(http, exporter)
    await control(http, exporter, "/gpus/1", {"util": 12})

    async with http.get(f"{exporter.url}/_control") as response:
        state = await response.json()
    async with http.get(f"{exporter.url}/_stats") as response:
        stats = await response.json()

    assert ("normal", 12) == (state["mode"], state["gpus"][1]["util"])
    assert 1 == stats["scrapes"]


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/gpus/7", {"util": 1}, 404),
        ("/gpus/0", {"util": 101}, 400),
        ("/gpus/0", {"health": 5}, 400),
        ("/gpus/0", {"volts": 1}, 400),
        ("", {"mode": "sideways"}, 400),
    ],
)
async def test_bad_controls_are_refused(
    exporter: FakeExporter,
    http: aiohttp.ClientSession,
    path: str,
    body: dict[str, Any],
    status: int,
) -> None:
    assert status == await control(http, exporter, path, body)


def test_unknown_counters_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="unknown counters"):
        FakeExporter(1, counters={"DCGM_FI_DEV_NOPE"})


def test_set_mode_in_process_refuses_an_unknown_mode() -> None:
    with pytest.raises(ControlError, match="mode"):
        FakeExporter(1).set_mode("sideways")
