"""An operation validates what it reads before it runs: a 400 BAD_REQUEST naming every key path,
unknown keys refused where the API promises it, the credential checked first."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from gpugate.web.schemas.admin import SpendDayView
from gpugate.web.schemas.batches import BatchCreate
from gpugate.web.schemas.common import validation_message
from harness import RunningGateway, make_config, serving, upstream

ADMIN = {"Authorization": "Bearer admin-token"}
JOB_KEYS = "model, input, operation, class, runner, slug, allow_external"


@pytest.fixture
async def gw(sqlite_dsn: str) -> AsyncIterator[RunningGateway]:
    config = make_config(sqlite_dsn, [upstream("u", ["http://127.0.0.1:9"], ["m"])])
    async with serving(
        config, environ={"GPUGATE_ADMIN_TOKEN": "admin-token"}, run_job_loops=False
    ) as running:
        yield running


async def refusal(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    async with http.request(method, url, json=body, headers=headers) as resp:
        error = (await resp.json())["error"]
    assert "BAD_REQUEST" == error["code"] or resp.status != 400
    return resp.status, error["message"]


def message_of(model: type[BatchCreate], data: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    return validation_message(caught.value, data, model)


async def test_a_bad_job_body_is_one_400_naming_every_key_path(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    body = {"model": 5, "input": {}, "class": "urgent", "extra": 1}

    status, message = await refusal(http, "POST", gw.url + "/v1/jobs", body)

    assert 400 == status
    assert [
        "model: expected a string, got 5",
        "class: expected 'system', 'interactive' or 'batch', got 'urgent'",
        f"extra: unknown key (allowed: {JOB_KEYS})",
    ] == message.split("; ")


async def test_bodies_are_strict_a_string_is_not_a_boolean_nor_a_number(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    body = {"model": "m", "input": {}, "allow_external": "yes"}

    status, message = await refusal(http, "POST", gw.url + "/v1/jobs", body)

    assert (400, "allow_external: expected true or false, got 'yes'") == (status, message)


async def test_a_nested_problem_is_named_by_its_full_key_path() -> None:
    data = {
        "endpoint": "/v1/chat/completions",
        "input": [{"custom_id": "a", "method": "GET", "url": "/v1/chat/completions", "body": {}}],
    }

    assert "input[0].method: expected 'POST', got 'GET'" == message_of(BatchCreate, data)


async def test_a_batch_with_an_unknown_key_is_refused_now(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    body = {"input_file_id": "file-1", "endpoint": "/v1/chat/completions", "priority": "high"}

    status, message = await refusal(http, "POST", gw.url + "/v1/batches", body)

    assert 400 == status
    assert message.startswith("priority: unknown key (allowed: input_file_id, input, endpoint")


async def test_a_reason_body_with_an_unknown_key_is_refused_and_an_empty_body_is_no_reason(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    url = gw.url + "/admin/runtimes/local/drain"

    status, message = await refusal(http, "POST", url, {"why": "maintenance"}, ADMIN)
    async with http.post(url, headers=ADMIN) as resp:
        drained = await resp.json()

    assert (400, "why: unknown key (allowed: reason)") == (status, message)
    assert (200, "drained", None) == (resp.status, drained["state"], drained["reason"])


async def test_query_parameters_are_checked_and_named(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    jobs = await refusal(http, "GET", gw.url + "/v1/jobs?limit=0&state=lost")
    audit = await refusal(
        http, "GET", gw.url + "/admin/audit?since=2025-01-01T00:00:00", None, ADMIN
    )

    assert 400 == jobs[0]
    assert jobs[1].startswith("state: expected 'queued', 'dispatching', ")
    assert jobs[1].endswith("; limit: expected a number of at least 1, got '0'")
    expected = "expected a time with its UTC offset (2025-01-01T00:00:00+00:00)"
    assert (400, f"since: {expected}, got '2025-01-01T00:00:00'") == audit


async def test_the_admin_token_is_checked_before_the_body(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    url = gw.url + "/admin/runtimes/local/disable"
    wrong = {"Authorization": "Bearer not-it"}

    status, message = await refusal(http, "POST", url, {"unknown": True}, wrong)

    assert (401, "missing or wrong admin token") == (status, message)


async def test_an_operator_name_that_cannot_go_in_the_audit_log_is_refused(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    headers = {**ADMIN, "X-Gpugate-Actor": "alice smith"}

    status, message = await refusal(
        http, "POST", gw.url + "/admin/runtimes/local/drain", None, headers
    )

    assert (
        400,
        "X-Gpugate-Actor: expected 1-64 letters, digits, '.', '_', '@' or '-'",
    ) == (status, message)


def test_cents_in_answers_carry_no_float_noise() -> None:
    # a day's spend summed from float cents (0.000597 + 0.000598) shows as 0.001195, not
    # 0.0011949999999999999; a millionth of a cent is kept
    day = SpendDayView.model_validate({"day": "2025-01-01", "cents": 0.000597 + 0.000598})
    assert '{"day":"2025-01-01","cents":0.001195}' == day.model_dump_json()
    assert 0.000001 == SpendDayView.model_validate({"day": "2025-01-01", "cents": 1e-6}).cents
