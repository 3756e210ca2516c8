"""A gateway worth fuzzing, and schemathesis run over its OpenAPI document.

:func:`fuzz_gateway` serves a gateway on loopback in front of a fake model server, with an admin
token, a push runtime and one job, file and batch to find. :func:`fuzz_operations` (blocking: run
it in a thread) reads ``GET /openapi.json`` and, for every operation, sends what schemathesis
generates from it — valid data and data the schema says is invalid — with the right credential,
and the known ids for half of the valid cases so the handlers' insides are reached. Each answer
is checked: never a 500, never a 503 ``STORE_ERROR`` (the store refusing what the edge let in),
no hang, and the answer is the one the document promises (status, content type, body schema).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import FailureGroup

from gpugate.fleet import ModelServer
from harness import RunningGateway, make_config, serving, upstream

ADMIN = "fuzz-admin-token"
WORKER = "fuzz-worker-secret"
ENVIRON = {"GPUGATE_ADMIN_TOKEN": ADMIN, "HOME_SECRET": WORKER}
HANG_S = 10.0
# Hypothesis as a bounded fuzz: no deadline per case (the machine is shared), no example
# database (a run is reproduced by its seed), every health check off (the API is slow on purpose
# in places), the first finding reported.
FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
    report_multiple_bugs=False,
)
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')
_LOOPBACK_URL = re.compile(r"^https?://127\.0\.0\.1(:\d+)?(/|$)")


@dataclass
class Target:
    """The gateway under fuzz: its URL, the ids worth aiming at, the console's credentials."""

    url: str
    known: dict[str, str]
    console_cookie: str = ""
    csrf: str = ""


@dataclass
class Tally:
    """What a run did: cases per operation and mode, and every finding."""

    cases: dict[str, int] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)

    def unreached(self) -> list[str]:
        """The operations no valid case was sent to (their schema could not be satisfied)."""
        return [label for label, n in self.cases.items() if n == 0 and label.endswith("positive")]

    def slowest(self, n: int = 5) -> str:
        ranked = sorted(self.seconds.items(), key=lambda item: -item[1])[:n]
        return ", ".join(f"{label} {s:.1f} s" for label, s in ranked)

    @property
    def total(self) -> int:
        return sum(self.cases.values())

    def summary(self) -> str:
        operations = len({label.rsplit(" ", 1)[0] for label in self.cases})
        return (
            f"schemathesis: {self.total} requests over {operations} operations "
            f"({len(self.cases)} operation x mode runs) in {self.elapsed_s:.1f} s, "
            f"{len(self.findings)} finding(s)"
        )


@contextlib.asynccontextmanager
async def fuzz_gateway(dsn: str) -> AsyncIterator[tuple[RunningGateway, Target]]:
    """The gateway (job loops running) and what the fuzz aims at."""
    home = {
        "id": "home",
        "kind": "push",
        "models": ["m"],
        # bearer, so that the fuzz can authenticate (the signed protocol: tests/security)
        "push": {"url": "http://127.0.0.1:9/calls", "secret_env": "HOME_SECRET", "auth": "bearer"},
    }
    async with ModelServer(["m"], name="fake") as fake:
        config = make_config(
            dsn,
            [upstream("u", [fake.url], ["m"])],
            runtimes=[{"id": "local", "kind": "upstream"}, home],
            fallback_chain=["local", "home"],
        )
        async with serving(config, environ=ENVIRON) as gw, aiohttp.ClientSession() as http:
            yield gw, await _target(gw, http)


async def _target(gw: RunningGateway, http: aiohttp.ClientSession) -> Target:
    body = {"model": "m", "input": {"messages": [{"role": "user", "content": "hi"}]}}
    async with http.post(gw.url + "/v1/jobs", json=body) as resp:
        slug = (await resp.json())["slug"]
    line = json.dumps(
        {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}
    )
    form = aiohttp.FormData({"purpose": "batch"})
    form.add_field("file", line.encode(), filename="in.jsonl")
    async with http.post(gw.url + "/v1/files", data=form) as resp:
        file_id = (await resp.json())["id"]
    batch = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
    async with http.post(gw.url + "/v1/batches", json=batch) as resp:
        batch_id = (await resp.json())["id"]
    known = {
        "slug": slug,
        "file_id": file_id,
        "batch_id": batch_id,
        "runtime": "home",
        "upstream_id": "u",
        "version": "1",
        "gpu": "0",
    }
    target = Target(gw.url, known)
    login = {"token": ADMIN, "name": "fuzz"}
    async with http.post(gw.url + "/console/login", data=login, allow_redirects=False) as resp:
        target.console_cookie = resp.cookies["gpugate_console"].value
    cookies = {"gpugate_console": target.console_cookie}
    async with http.get(gw.url + "/console/runtimes", cookies=cookies) as resp:
        found = _CSRF.search(await resp.text())
    assert found is not None, "the console page carries its CSRF token"
    target.csrf = found.group(1)
    return target


def fuzz_operations(target: Target, *, examples: int, seed: int) -> Tally:
    """Run schemathesis over every operation (see the module docstring); blocking."""
    schema = schemathesis.openapi.from_url(target.url + "/openapi.json")
    tally = Tally()
    started = time.monotonic()
    with requests.Session() as session:
        for result in schema.get_all_operations():
            operation = result.ok()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                _fuzz_one(operation, mode, target, session, tally, examples=examples, seed=seed)
    tally.elapsed_s = time.monotonic() - started
    return tally


def _fuzz_one(
    operation: Any,
    mode: GenerationMode,
    target: Target,
    session: requests.Session,
    tally: Tally,
    *,
    examples: int,
    seed: int,
) -> None:
    label = f"{operation.label} {mode.value}"
    strategy = operation.as_strategy(generation_mode=mode)
    known = {
        name: value
        for name, value in target.known.items()
        if f"{{{name}}}" in operation.path and name != "path"
    }
    if mode is GenerationMode.POSITIVE and known:
        strategy = st.one_of(strategy, operation.as_strategy(path_parameters=known))
    tally.cases[label] = 0

    @given(case=strategy)
    @settings(FUZZ, max_examples=examples)
    def send(case: Case) -> None:
        if not _stays_on_loopback(case):
            return
        tally.cases[label] += 1
        finding = _check(case, mode, target, session)
        if finding is not None:
            tally.findings.append(f"{label}: {finding}\n    {case.as_curl_command()[:600]}")

    started = time.monotonic()
    with contextlib.suppress(Unsatisfiable):  # nothing to make invalid (no inputs at all)
        _seeded(send, seed)()
    tally.seconds[label] = time.monotonic() - started


def _seeded(test: Callable[[], None], seed: int) -> Callable[[], None]:
    from hypothesis import seed as with_seed

    decorated: Callable[[], None] = with_seed(seed)(test)
    return decorated


def _stays_on_loopback(case: Case) -> bool:
    """A config import may name upstreams and workers: only loopback ones are sent."""
    if case.method != "PUT" or case.path != "/admin/config":
        return True
    urls = re.findall(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"']*", str(case.body))
    return all(_LOOPBACK_URL.match(url) for url in urls)


def _credentials(case: Case, target: Target) -> dict[str, str]:
    security = case.operation.definition.raw.get("security")
    if security == [{"admin": []}]:
        return {"Authorization": f"Bearer {ADMIN}"}
    if {"worker": []} in (security or []):
        return {"Authorization": f"Bearer {WORKER}"}
    if security == [{"consoleSession": []}]:
        if isinstance(case.body, dict) and "csrf" in case.body:
            case.body["csrf"] = target.csrf
        return {"Cookie": f"gpugate_console={target.console_cookie}"}
    return {}


def _check(
    case: Case, mode: GenerationMode, target: Target, session: requests.Session
) -> str | None:
    """What is wrong with the answer to ``case``, or None."""
    if isinstance(case.query, dict) and "wait" in case.query:
        case.query["wait"] = 0  # the synchronous front would hold the case for its job
    try:
        response = case.call(
            base_url=target.url,
            session=session,
            headers=_credentials(case, target),
            timeout=HANG_S,
            allow_redirects=False,
        )
    except requests.Timeout:
        return f"no answer within {HANG_S:g} s"
    except requests.ConnectionError as exc:
        return f"the connection broke: {exc}"
    status = response.status_code
    code = _code(response)
    if status == 500 or code == "STORE_ERROR":
        return f"{status} {code}: {response.text[:300]}"
    if mode is GenerationMode.POSITIVE or status < 500:
        checks = [status_code_conformance, content_type_conformance, response_schema_conformance]
        try:
            case.validate_response(response, checks=checks)
        except FailureGroup as exc:
            return f"{status}: the answer is not the documented one: {str(exc)[:600]}"
    return None


def _code(response: requests.Response) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return ""
