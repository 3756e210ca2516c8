"""A rolling upgrade across one migration step, both ways (issue #20, docs/production.md).

The previous version is the real one: the package as it was just before the last migration was
added, taken from git and run as a ``gpugate serve`` of its own. The new version starts beside
it on the same PostgreSQL and applies the migration while the old one serves; both run
jobs; then the new one stops (a rollback of the roll-out) and the old one goes on, on the
migrated schema. Skipped, with one notice line, where git or that commit is missing.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import tarfile
import time
from io import BytesIO
from pathlib import Path

import aiohttp
import psycopg
import pytest
from jobs_e2e import GatewayProcess, create_jobs, write_config

from gpugate.fleet import ModelServer
from gpugate.store.migrations import load_migrations
from ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
_VERSION = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
MIGRATIONS = "src/gpugate/store/sql"


def previous_version(into: Path) -> tuple[Path, set[int]] | None:
    """The ``src`` tree of main just before the last commit (or merge) that added migrations,
    and the versions it added (the step); None without git history.

    A version is a migration file's number, in either layout the package has had
    (``sql/<backend>/NNNN_name.sql`` until issue #17, ``sql/NNNN_name.sql`` since), so moving
    the files is no step and adding one is."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        return None

    def run(*args: str) -> str:
        done = subprocess.run([git, "-C", str(ROOT), *args], capture_output=True, check=True)
        return done.stdout.decode()

    def versions(commit: str) -> set[int]:
        names = run("ls-tree", "-r", "--name-only", commit, "--", MIGRATIONS).split()
        return {int(match[1]) for name in names if (match := _VERSION.match(Path(name).name))}

    try:
        # main's own line: a merge that brought migrations in counts against its first parent
        touching = run("log", "--first-parent", "-m", "--format=%H", "--", MIGRATIONS).split()
        for last in touching:
            if step := versions(last) - versions(f"{last}^1"):
                break
        else:
            return None
        archive = subprocess.run(
            [git, "-C", str(ROOT), "archive", "--format=tar", f"{last}^1", "src"],
            capture_output=True,
            check=True,
        ).stdout
    except subprocess.CalledProcessError:
        return None
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src", step


class OldGateway(GatewayProcess):
    """``gpugate serve`` of the previous version: its own package first on the path."""

    def __init__(self, config: Path, port: int, log: Path, src: Path) -> None:
        super().__init__(config, port, log)
        self.src = src

    async def start(self, http: aiohttp.ClientSession, *, within_s: float = 20) -> None:
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(self.src)
        try:
            await super().start(http, within_s=within_s)
        finally:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved


async def migrations(dsn: str) -> list[int]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        rows = await (await conn.execute("SELECT version FROM schema_migrations")).fetchall()
    return sorted(row[0] for row in rows)


async def completed(dsn: str, slugs: list[str]) -> dict[str, int]:
    """Each slug's count of ``completed`` events (a job completed once has one)."""
    query = """SELECT j.slug, count(e.id) FILTER (WHERE e.status = 'completed') FROM jobs j
               LEFT JOIN job_events e ON e.job_id = j.id WHERE j.slug = ANY(%s) GROUP BY j.slug"""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        rows = await (await conn.execute(query, [slugs])).fetchall()
    return dict(rows)


async def test_a_previous_version_keeps_working_while_the_next_migrates_and_after_a_rollback(
    tmp_path: Path, http: aiohttp.ClientSession, postgres_schema: str
) -> None:
    found = previous_version(tmp_path / "previous")
    if found is None:
        pytest.skip("no git history here: the version before the last migration cannot be built")
    src, step = found
    async with ModelServer(["qwen"], name="q0") as fleet:
        old_port, new_port = free_port(), free_port()
        old = OldGateway(
            write_config(
                tmp_path / "old.yaml", port=old_port, store=postgres_schema, upstream_url=fleet.url
            ),
            old_port,
            tmp_path / "old.log",
            src,
        )
        new = GatewayProcess(
            write_config(
                tmp_path / "new.yaml", port=new_port, store=postgres_schema, upstream_url=fleet.url
            ),
            new_port,
            tmp_path / "new.log",
        )
        try:
            await old.start(http)
            before = await migrations(postgres_schema)
            first = [f"old-{i}" for i in range(20)]
            await create_jobs(http, [old.url], first)

            await new.start(http)  # applies the step while the old version serves
            after = await migrations(postgres_schema)
            during = [f"both-{i}" for i in range(40)]
            await create_jobs(http, [old.url, new.url], during)

            await new.stop()  # roll back: the old version alone, on the migrated schema
            rolled_back = [f"back-{i}" for i in range(20)]
            await create_jobs(http, [old.url], rolled_back)
            slugs = first + during + rolled_back
            done: dict[str, int] = {}

            async def all_done() -> bool:
                done.update(await completed(postgres_schema, slugs))
                return len(done) == len(slugs) and all(n >= 1 for n in done.values())

            deadline = time.monotonic() + 30
            while not await all_done() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert old.alive, old.tail()
        finally:
            await new.stop()
            await old.stop()

    assert step  # the last migration step: what the new version adds
    assert set(after) - set(before) == step  # ... applied while the old version served
    assert [m.version for m in load_migrations("postgres")] == after
    assert dict.fromkeys(slugs, 1) == done  # every job completed, once, through either
