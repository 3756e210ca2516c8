"""Finding 5 (issue #15): a config import could name any environment variable in a ``*_env``
key and so deliver its value to a URL of the importer's choosing, and the 422 for an unset
variable told which variables exist.

An import may now name only the variables the process allows: those with the ``import_env``
prefix (``GPUGATE_SECRET_``), those in ``import_env.allow``, and those the config file itself
names — never one a process key uses — and one message covers unset and not allowed alike.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from gpugate.config.environment import importable_environ
from harness import make_config, serving, upstream
from ops.ops_rig import TOKEN, Admin

ENVIRON = {
    "GPUGATE_ADMIN_TOKEN": TOKEN,
    "FILE_KEY": "sk-named-by-the-file",
    "GPUGATE_SECRET_NEW": "sk-new-by-prefix",
    "LISTED_KEY": "sk-on-the-allow-list",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-of-the-host",
    "S3_SECRET": "s3-secret-of-the-blob-store",
}


def file_config(dsn: str, **extra: Any) -> Any:
    return make_config(
        dsn,
        [upstream("u1", ["http://127.0.0.1:9"], ["m1"], api_key_env="FILE_KEY")],
        import_env={"allow": ["LISTED_KEY", "S3_SECRET"]},
        **extra,
    )


def naming(document: dict[str, Any], variable: str, url: str = "http://127.0.0.1:9") -> str:
    """The document with a new upstream that sends ``variable``'s value to ``url``."""
    changed = json.loads(json.dumps(document))
    changed["upstreams"].append(upstream("u2", [url], ["m2"], api_key_env=variable))
    return json.dumps(changed)


@contextlib.asynccontextmanager
async def importer(
    dsn: str, http: aiohttp.ClientSession
) -> AsyncIterator[tuple[Admin, dict[str, Any], Any]]:
    """The gateway of :func:`file_config`: an admin client, the exported document, the gateway."""
    async with serving(file_config(dsn), environ=ENVIRON) as gw:
        admin = Admin(http, gw.url)
        yield admin, (await admin.export()).body, gw.gateway


def problems(reply: Any) -> list[tuple[str, str]]:
    return [(p["path"], p["message"]) for p in reply.body["error"]["problems"]]


def test_finding5_an_import_may_name_the_prefix_the_allow_list_and_the_files_own_names() -> None:
    blobs = {"kind": "local", "s3": {"bucket": "b", "secret_access_key_env": "S3_SECRET"}}
    config = file_config("sqlite:///unused.db", blobs=blobs)
    environ = {**ENVIRON, "GPUGATE_SECRET_EMPTY": ""}

    assert {
        "FILE_KEY": "sk-named-by-the-file",
        "GPUGATE_SECRET_NEW": "sk-new-by-prefix",
        "LISTED_KEY": "sk-on-the-allow-list",
    } == importable_environ(config, environ)  # no admin token, no blob-store key, no empty


async def test_finding5_an_import_naming_any_other_variable_is_refused_and_changes_nothing(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with importer(sqlite_dsn, http) as (admin, exported, gateway):
        reply = await admin.import_text(naming(exported, "AWS_SECRET_ACCESS_KEY"))
        token = await admin.import_text(naming(exported, "GPUGATE_ADMIN_TOKEN"))
        version = gateway.config_version
    assert (422, 422, 1) == (reply.status, token.status, version)
    assert ["upstreams[1].api_key_env"] == [path for path, _ in problems(reply)]


async def test_finding5_unset_and_not_allowed_variables_get_the_same_refusal(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with importer(sqlite_dsn, http) as (admin, exported, _):
        exists = await admin.import_text(naming(exported, "AWS_SECRET_ACCESS_KEY"))
        absent = await admin.import_text(naming(exported, "NO_SUCH_VARIABLE_ANYWHERE"))
        allowed_but_unset = await admin.import_text(naming(exported, "GPUGATE_SECRET_UNSET"))
    messages = {
        message.replace(name, "X")
        for reply, name in (
            (exists, "AWS_SECRET_ACCESS_KEY"),
            (absent, "NO_SUCH_VARIABLE_ANYWHERE"),
            (allowed_but_unset, "GPUGATE_SECRET_UNSET"),
        )
        for _, message in problems(reply)
    }
    assert 1 == len(messages)


async def test_finding5_an_import_naming_allowed_variables_is_taken(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with importer(sqlite_dsn, http) as (admin, exported, _):
        replies = [
            await admin.import_text(naming(exported, name))
            for name in ("GPUGATE_SECRET_NEW", "LISTED_KEY", "FILE_KEY")
        ]
    assert [200, 200, 200] == [reply.status for reply in replies]


async def test_finding5_a_rollback_to_a_version_naming_a_variable_no_longer_allowed_is_refused(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with serving(file_config(sqlite_dsn), environ=ENVIRON):
        pass  # version 1 names FILE_KEY, which that file allowed
    narrower = make_config(sqlite_dsn, [upstream("u1", ["http://127.0.0.1:9"], ["m1"])])
    async with serving(narrower, environ=ENVIRON) as gw:
        reply = await Admin(http, gw.url).call("POST", "/admin/config/rollback/1")
    assert 422 == reply.status
    assert ["upstreams[0].api_key_env"] == [path for path, _ in problems(reply)]
