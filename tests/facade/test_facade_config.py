"""The façades' config: ``kind: azure-di`` upstreams and their rules, ``cache`` blocks."""

from __future__ import annotations

from typing import Any

from gpugate.config import CacheConfig, config_from_document
from gpugate.errors import ConfigError

ONE_URL = (
    "upstreams[1].urls: an azure-di upstream is one resource: give one url (polls return to it)"
)
NOT_SERVED = (
    "runtimes[0].models[0]: model 'prebuilt-layout' is not served by any upstream (served: qwen)"
)


def di(
    upstream_id: str = "azure", *, models: tuple[str, ...] = ("prebuilt-layout",), **keys: Any
) -> dict[str, Any]:
    entry = {"id": upstream_id, "url": "http://127.0.0.1:9400", "models": list(models)}
    return {**entry, "kind": "azure-di", **keys}


def openai_upstream(**keys: Any) -> dict[str, Any]:
    return {"id": "qwen", "url": "http://127.0.0.1:8001", "models": ["qwen"], **keys}


def problems(*upstreams: dict[str, Any], **keys: Any) -> list[str]:
    try:
        config_from_document({"upstreams": list(upstreams), **keys})
    except ConfigError as exc:
        return [str(problem) for problem in exc.problems]
    return []


def test_an_upstream_is_openai_unless_it_says_otherwise() -> None:
    config = config_from_document({"upstreams": [openai_upstream()]})

    assert config.upstreams[0].kind == "openai"


def test_an_azure_di_upstream_is_external_by_nature() -> None:
    config = config_from_document({"upstreams": [openai_upstream(), di()]})

    assert config.upstream("azure").external is True


def test_an_azure_di_upstream_said_to_be_internal_is_a_problem() -> None:
    assert problems(openai_upstream(), di(external=False)) == [
        "upstreams[1].external: an azure-di upstream is a third-party service"
    ]


def test_an_azure_di_upstream_has_one_url_and_no_gpus() -> None:
    several = {**di(), "urls": ["http://127.0.0.1:1", "http://127.0.0.1:2"]}
    del several["url"]

    assert problems(openai_upstream(), several, di("other", models=("m",), gpu_ids=[0])) == [
        ONE_URL,
        "upstreams[2].gpu_ids: an azure-di upstream runs on no GPU of ours: it takes no gpu_ids",
    ]


def test_a_di_model_id_has_one_azure_di_upstream() -> None:
    assert problems(openai_upstream(), di("a"), di("b")) == [
        "upstreams[2].models[0]: DI model 'prebuilt-layout' is served by azure-di upstream 'a'"
    ]


def test_di_model_ids_are_not_job_models() -> None:
    config = config_from_document({"upstreams": [openai_upstream(), di()]})

    assert config.runtime_models("local") == ["qwen"]
    assert config.azure_di_upstream("prebuilt-layout") is config.upstream("azure")
    assert problems(
        openai_upstream(),
        di(),
        runtimes=[{"id": "local", "kind": "upstream", "models": ["prebuilt-layout"]}],
    ) == [NOT_SERVED]


def test_a_cache_block_on_an_upstream_or_a_runtime_is_read_with_its_defaults() -> None:
    config = config_from_document(
        {
            "upstreams": [openai_upstream(cache={"ttl_s": 60})],
            "runtimes": [
                {"id": "local", "kind": "upstream", "cache": {"ttl_s": 5, "max_entries": 3}}
            ],
        }
    )

    assert config.upstreams[0].cache == CacheConfig(ttl_s=60, max_entries=1024)
    assert config.runtimes[0].cache == CacheConfig(ttl_s=5, max_entries=3)


def test_a_cache_without_a_positive_ttl_is_a_problem() -> None:
    assert problems(openai_upstream(cache={"ttl_s": 0})) == [
        "upstreams[0].cache.ttl_s: expected a number greater than 0, got 0"
    ]
