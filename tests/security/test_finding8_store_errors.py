"""Finding 8 (issue #15): store errors and ``/readyz`` showed the database's host and user (or
file), and ``sslpassword`` was not redacted where a store URL is shown.

Anyone may read ``/readyz``, and a client whose request fails on the store reads its error: both
now get the error's public message; the operator's log keeps the whole story, without passwords.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import aiohttp
import pytest

from gpugate.clock import SystemClock
from gpugate.config import parse_config
from gpugate.config.fields import redact_store_url
from gpugate.store.factory import open_store
from harness import make_config, serving, upstream

PASSWORD, SSL_PASSWORD = "hunter2-pw", "topsecret-sslpw"


def with_passwords(dsn: str) -> str:
    """A PostgreSQL DSN with a password and an sslpassword (trust auth ignores both)."""
    if not dsn.startswith("postgresql://"):
        return dsn
    rest = dsn.removeprefix("postgresql://")
    user, _, host = rest.partition("@")
    joiner = "&" if "?" in host else "?"
    return f"postgresql://{user}:{PASSWORD}@{host}{joiner}sslpassword={SSL_PASSWORD}"


def identifying_parts(dsn: str) -> list[str]:
    """What a stranger must not learn from an error: the host, port, user, file and passwords."""
    if dsn.startswith("sqlite:///"):
        return [dsn.removeprefix("sqlite:///")]
    parts = urlsplit(dsn)
    return [f"{parts.hostname}:{parts.port}", f"{parts.username}@", PASSWORD, SSL_PASSWORD]


def test_finding8_a_shown_store_url_keeps_no_password_nor_sslpassword() -> None:
    dsn = f"postgresql://gg:{PASSWORD}@db.internal:6432/gpugate?sslpassword={SSL_PASSWORD}&sslmode=require&password={PASSWORD}"
    assert "postgresql://gg@db.internal:6432/gpugate?sslmode=require" == redact_store_url(dsn)


def test_finding8_the_store_repr_and_check_config_summary_show_no_sslpassword() -> None:
    dsn = f"postgresql://gg@db.internal:6432/gpugate?sslpassword={SSL_PASSWORD}"
    config = parse_config(
        f"store: {dsn}\nupstreams: [{{id: u, url: http://127.0.0.1:9, models: [m]}}]\n"
    )
    store = open_store(dsn, clock=SystemClock())
    shown = [repr(store), *config.summary_lines()]
    assert [] == [line for line in shown if SSL_PASSWORD in line]
    assert "store           postgresql://gg@db.internal:6432/gpugate" in shown


async def test_finding8_readyz_and_a_clients_store_error_name_no_host_user_file_or_password(
    dsn: str, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    store_url = with_passwords(dsn)
    config = make_config(store_url, [upstream("u", ["http://127.0.0.1:9"], ["m"])])
    async with serving(config, run_job_loops=False) as gw:
        await gw.gateway.store.close()  # the store is gone: every use fails at once
        async with http.get(gw.url + "/readyz") as resp:
            ready = (resp.status, await resp.text())
        job = {"model": "m", "input": {"messages": []}}
        async with http.post(gw.url + "/v1/jobs", json=job) as resp:
            refused = (resp.status, await resp.json())
    status, text = ready
    assert 503 == status
    assert "The store cannot be reached." in text
    assert (503, "STORE_UNAVAILABLE") == (refused[0], refused[1]["error"]["code"])
    seen = [text, str(refused[1])]
    leaks = [part for part in identifying_parts(store_url) for shown in seen if part in shown]
    assert [] == leaks
    logged = caplog.text
    assert "is not open" in logged or "is closed" in logged  # the operator still learns why
    assert [] == [secret for secret in (PASSWORD, SSL_PASSWORD) if secret in logged]
