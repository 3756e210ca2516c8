"""Every real scrape in tests/fixtures/metrics, read by hand and written down here.

Per file: one row per GPU and MIG instance, ``(host, gpu, instance, util_pct, temp_c)`` as the
file holds them (None where the file has no such series), checked through the readings and
through ``gpus inspect``.
"""

from __future__ import annotations

import json

import pytest
from gpu_factories import TABLE, fixture_dir, fixture_readings, thresholds

from gpugate.core.gpu.report import inspect

H100_HOST = "ip-10-0-171-111.ec2.internal"
MIG_HOST = "nvidia-dcgm-exporter-tl46n"
T4_HOST = "nvidia-dcgm-exporter-s228n"

Row = tuple[str | None, int, str | None, float | None, float | None]

EXPECTED: dict[str, list[Row]] = {
    # 8x H100, a sampled subset: GPU_TEMP, POWER_USAGE, GPU_UTIL for all eight, no XID series.
    "dcgm-exporter-aicr-eks-h100-8gpu-k8s-nohelp.prom": [
        (H100_HOST, 0, None, 0, 30),
        (H100_HOST, 1, None, 0, 29),
        (H100_HOST, 2, None, 0, 26),
        (H100_HOST, 3, None, 0, 29),
        (H100_HOST, 4, None, 0, 28),
        (H100_HOST, 5, None, 0, 26),
        (H100_HOST, 6, None, 0, 28),
        (H100_HOST, 7, None, 0, 26),
    ],
    # RTX 6000 Ada: GPU_UTIL 1, no GPU_TEMP series at all.
    "dcgm-exporter-aiperf-rtx6000ada-1gpu-violations.prom": [
        ("ed7e7a5e585f", 0, None, 1, None),
    ],
    # Stitched from three machines, all "gpu 0": a T4 with util and temp, a T4 with only
    # label fields and the throttle bitmask, an A10G with one PROF series. The unlabeled dummy
    # samples belong to no GPU.
    "dcgm-exporter-datadog-t4-stitched-throttle-unlabeled.prom": [
        ("424773df46e0", 0, None, 0, 25),
        ("551bdf382151", 0, None, None, None),
        ("ip-11111", 0, None, None, None),
    ],
    "dcgm-exporter-k8sconf-ericsson-t4-1gpu-busy-nohelp.prom": [
        ("cp-bm14r7", 0, None, 91, 74),
    ],
    "dcgm-exporter-k8sconf-kops-l4-1gpu.prom": [
        ("i-030791dc5a37cd257", 0, None, 0, 31),
    ],
    "dcgm-exporter-k8sconf-upcloud-l40s-1gpu.prom": [
        ("gpu1-wl8sg", 0, None, 0, 32),
    ],
    # MIG: four instances of GPU 0, no whole-GPU row, no GPU_UTIL on MIG rows.
    "dcgm-exporter-runai-a100-mig-4instances.prom": [
        (MIG_HOST, 0, "5", None, 35),
        (MIG_HOST, 0, "7", None, 35),
        (MIG_HOST, 0, "8", None, 35),
        (MIG_HOST, 0, "9", None, 35),
    ],
    "dcgm-exporter-runai-t4-2gpu-k8s-pod.prom": [
        (T4_HOST, 0, None, 0, 55),
        (T4_HOST, 1, None, 0, 52),
    ],
    # vLLM's own /metrics: no DCGM series, so no GPU.
    "vllm-v1-k8sconf-kops-qwen2.5-0.5b-idle.prom": [],
}

# (host, gpu, instance) -> (uuid, model, last_xid, verdict), for the rows worth pinning.
IDENTITIES = {
    (H100_HOST, 0, None): (
        "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005",
        "NVIDIA H100 80GB HBM3",
        None,
        "ok",
    ),
    ("ed7e7a5e585f", 0, None): (
        "GPU-ef6ef310-f8e2-cef9-036e-8f12d59b5ffc",
        "NVIDIA RTX 6000 Ada Generation",
        0,
        "ok",
    ),
    ("551bdf382151", 0, None): (
        "GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5",
        "Tesla T4",
        None,
        "ok",
    ),
    ("ip-11111", 0, None): ("GPU-abc", "NVIDIA A10G", None, "unknown"),
    ("cp-bm14r7", 0, None): ("GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a", "Tesla T4", None, "ok"),
    (MIG_HOST, 0, "8"): (
        "GPU-473571f2-fb37-ef7e-50fe-9885b74a23cd",
        "NVIDIA A100-SXM4-40GB",
        0,
        "ok",
    ),
    (T4_HOST, 1, None): ("GPU-5f587dd4-6505-0873-c6db-8324dbfe5ba9", "Tesla T4", 0, "ok"),
}


def test_every_fixture_file_has_a_table_here() -> None:
    assert sorted(EXPECTED) == sorted(path.name for path in fixture_dir().glob("*.prom"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_readings_hold_the_util_and_temperature_of_the_file(name: str) -> None:
    found = fixture_readings(name)

    actual = [(r.key.host, r.key.gpu, r.key.instance, r.util_pct, r.temp_c) for r in found]
    assert EXPECTED[name] == actual


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_gpus_inspect_shows_the_util_and_temperature_of_the_file(name: str) -> None:
    entries = inspect(fixture_readings(name), TABLE, thresholds())

    actual = [(e["host"], e["gpu"], e["instance"], e["util_pct"], e["temp_c"]) for e in entries]
    assert EXPECTED[name] == actual
    json.dumps(entries)  # the entries are JSON as they are


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_no_real_scrape_faults_a_gpu(name: str) -> None:
    """They are all healthy machines; only the Datadog A10G row has nothing to judge."""
    entries = inspect(fixture_readings(name), TABLE, thresholds())

    verdicts = {(e["host"], e["gpu"], e["instance"]): e["verdict"] for e in entries}
    expected = {key: "unknown" if key == ("ip-11111", 0, None) else "ok" for key in verdicts}
    assert expected == verdicts


def test_uuid_model_and_last_xid_come_from_the_labels_and_the_xid_series() -> None:
    entries = [
        entry for name in EXPECTED for entry in inspect(fixture_readings(name), TABLE, thresholds())
    ]
    shown = {
        (e["host"], e["gpu"], e["instance"]): (e["uuid"], e["model"], e["last_xid"], e["verdict"])
        for e in entries
    }

    assert IDENTITIES == {key: shown[key] for key in IDENTITIES}


def test_the_old_throttle_bitmask_name_is_read_and_decoded() -> None:
    datadog = fixture_readings("dcgm-exporter-datadog-t4-stitched-throttle-unlabeled.prom")

    entries = {e["host"]: e for e in inspect(datadog, TABLE, thresholds())}

    assert ["gpu_idle"] == entries["551bdf382151"]["clock_reasons"]
    assert [] == entries["424773df46e0"]["clock_reasons"]


def test_k8s_pod_labels_are_kept_and_empty_ones_are_none() -> None:
    t4 = fixture_readings("dcgm-exporter-runai-t4-2gpu-k8s-pod.prom")

    actual = [(r.key.gpu, r.pod, r.namespace, r.container) for r in t4]

    assert [
        (
            0,
            "runai-reservation-gpu-qa-mig-worker-gpu-1-kvltw",
            "runai-reservation",
            "runai-reservation",
        ),
        (1, None, None, None),
    ] == actual


def test_mig_instances_keep_their_profile_and_share_the_parent_uuid() -> None:
    mig = fixture_readings("dcgm-exporter-runai-a100-mig-4instances.prom")

    actual = [(r.key.instance, r.profile, r.uuid) for r in mig]

    parent = "GPU-473571f2-fb37-ef7e-50fe-9885b74a23cd"
    assert [
        ("5", "2g.10gb", parent),
        ("7", "1g.5gb", parent),
        ("8", "1g.5gb", parent),
        ("9", "1g.5gb", parent),
    ] == actual


def test_the_row_remap_flag_of_the_l4_is_read_as_false_not_absent() -> None:
    l4 = fixture_readings("dcgm-exporter-k8sconf-kops-l4-1gpu.prom")

    assert [False] == [r.row_remap_failure for r in l4]


def test_an_operator_host_name_replaces_the_hostname_label() -> None:
    t4 = fixture_readings("dcgm-exporter-runai-t4-2gpu-k8s-pod.prom", host="node-a")

    assert [("node-a", 0), ("node-a", 1)] == [(r.key.host, r.key.gpu) for r in t4]
