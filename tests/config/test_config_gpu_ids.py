"""``gpu_ids`` follow the exporter form: indexes for ``dcgm_url``, ``host/index`` for exporters."""

from __future__ import annotations

from typing import Any

import pytest
from config_factories import config_of, document, problems_of_document, upstream

DCGM = {"dcgm_url": "http://127.0.0.1:9400/metrics"}
EXPORTERS = {
    "exporters": [
        {"host": "node-a", "url": "http://127.0.0.1:9401/metrics"},
        {"host": "node-b", "url": "http://127.0.0.1:9402/metrics"},
    ]
}


def gpu_problems(gpu_ids: list[Any], gpu_health: dict[str, Any] | None) -> list[str]:
    keys = {} if gpu_health is None else {"gpu_health": gpu_health}
    return problems_of_document(document(upstreams=[upstream(gpu_ids=gpu_ids)], **keys))


def test_with_dcgm_url_gpus_are_indexes() -> None:
    assert [0, 1] == config_of(gpu_health=DCGM, upstreams=[upstream(gpu_ids=[0, 1])]).upstreams[
        0
    ].gpu_ids


@pytest.mark.parametrize(("gpu_id", "got"), [("node-a/0", "'node-a/0'"), (-1, "-1"), ("0", "'0'")])
def test_with_dcgm_url_anything_but_an_index_is_a_problem(gpu_id: Any, got: str) -> None:
    assert [
        (
            "upstreams[0].gpu_ids[1]: expected a GPU index (an integer >= 0) because"
            f" gpu_health.dcgm_url names a single exporter, got {got}"
        )
    ] == gpu_problems([0, gpu_id], DCGM)


def test_with_exporters_gpus_are_host_slash_index() -> None:
    config = config_of(gpu_health=EXPORTERS, upstreams=[upstream(gpu_ids=["node-a/0", "node-b/3"])])

    assert ["node-a/0", "node-b/3"] == config.upstreams[0].gpu_ids


def test_with_exporters_an_index_is_a_problem() -> None:
    assert [
        (
            "upstreams[0].gpu_ids[0]: expected 'host/index' (e.g. 'node-a/0') because"
            " gpu_health.exporters names several hosts, got 0"
        )
    ] == gpu_problems([0], EXPORTERS)


def test_with_exporters_a_host_without_an_exporter_is_a_problem() -> None:
    assert [
        (
            "upstreams[0].gpu_ids[0]: names host 'node-c', which has no exporter"
            " (hosts: node-a, node-b)"
        )
    ] == gpu_problems(["node-c/0"], EXPORTERS)


@pytest.mark.parametrize("gpu_health", [None, {"dcgm_url": ""}, {"poll_s": 5}])
def test_dormant_accepts_either_form(gpu_health: dict[str, Any] | None) -> None:
    assert [] == gpu_problems([0, "node-a/1"], gpu_health)


@pytest.mark.parametrize(
    ("gpu_id", "got"), [(-1, "-1"), ("node-a", "'node-a'"), ("a/b/1", "'a/b/1'")]
)
def test_dormant_still_wants_well_formed_gpus(gpu_id: Any, got: str) -> None:
    assert [
        (
            "upstreams[0].gpu_ids[0]: expected a GPU index (an integer >= 0) or 'host/index',"
            f" got {got}"
        )
    ] == gpu_problems([gpu_id], None)


@pytest.mark.parametrize(("gpu_id", "got"), [(1.5, "1.5"), (True, "true"), (None, "null")])
def test_a_gpu_that_is_neither_number_nor_string_is_a_type_problem(gpu_id: Any, got: str) -> None:
    assert [
        f"upstreams[0].gpu_ids[0]: expected a GPU index (0) or 'host/index' (node-a/0), got {got}"
    ] == gpu_problems([gpu_id], None)
