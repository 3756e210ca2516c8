"""The README and every manual under docs/ name only things that exist (issue #19 done-when 5):
every ``gpugate`` command, every HTTP route and every config key they mention is checked against
the CLI's parser, the served OpenAPI document and the config's models; and the README links
every manual."""

from __future__ import annotations

import argparse
import ast
import asyncio
import re
import sys
from functools import cache
from pathlib import Path

import aiohttp
import pytest

from gpugate.cli import build_parser
from harness import make_config, serving, upstream

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs"))
from config_reference import all_keys  # noqa: E402 - the docs' own generator

README = ROOT / "README.md"
MANUALS = sorted(p for p in (ROOT / "docs").glob("*.md"))
DOCS = [README, *MANUALS]

_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.DOTALL)
#: ``gpugate CMD [SUB]`` as a command line: at a line's start or after a shell character.
_COMMAND = re.compile(
    r"(?:^|(?<=[\s$(|&;]))gpugate ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)?)", re.MULTILINE
)
_ROUTE = re.compile(r"\b(GET|POST|PUT|PATCH|DELETE|ANY) (/[A-Za-z0-9_{}./:-]*)")
_KEY = re.compile(r"^[a-z][a-z_]*(?:\[\])?(?:\.[a-z][a-z_0-9]*(?:\[\])?)+$")
#: Route shapes that name a documented *pattern* (``POST /v1/{operation}`` of a job's input),
#: not one route of the app.
_ROUTE_PATTERNS = {"/v1/{}", "/u", "/"}
#: The push worker's routes (served by ``gpugate worker``, not the gateway) and the simulated
#: fleet's control routes (``/_control``, ``/_stats``).
_WORKER_ROUTES = ("/calls", "/{}", "/_")
#: Docs that discuss the code itself (module paths, attributes), not the config.
_ABOUT_THE_CODE = {"decisions.md", "architecture.md"}


def code_spans(path: Path) -> list[str]:
    """The code in ``path``: fenced blocks and inline spans (facts live there)."""
    return _CODE.findall(path.read_text(encoding="utf-8"))


@cache
def commands() -> dict[str, set[str]]:
    """Each top-level command -> its subcommands (empty: it has none)."""
    found: dict[str, set[str]] = {}
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = set()
                for inner in sub._actions:
                    if isinstance(inner, argparse._SubParsersAction):
                        found[name] |= set(inner.choices)
    return found


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> set[tuple[str, str]]:
    """(METHOD, path pattern) of every operation the gateway's OpenAPI document lists."""
    return asyncio.run(_routes(tmp_path_factory.mktemp("docs") / "gpugate.db"))


async def _routes(db: Path) -> set[tuple[str, str]]:
    config = make_config(f"sqlite:///{db}", [upstream("u", ["http://127.0.0.1:9"], ["m"])])
    async with serving(config) as gw, aiohttp.ClientSession() as http:
        async with http.get(gw.url + "/openapi.json") as resp:
            document = await resp.json()
    return {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
    }


def _shape(path: str) -> str:
    """A path with each ``{parameter}`` (or concrete id) reduced to ``{}``."""
    return re.sub(r"\{[^}]*\}", "{}", path.split("?", maxsplit=1)[0].rstrip("/.:") or "/")


def _route_known(method: str, path: str, known: set[tuple[str, str]]) -> bool:
    shape = _shape(path)
    if shape in _ROUTE_PATTERNS or shape.startswith(_WORKER_ROUTES):
        return True
    for known_method, known_path in known:
        if method not in ("ANY", known_method):
            continue
        pattern = re.escape(_shape(known_path)).replace(r"\{\}", "[^/]+")
        if known_path.endswith("{path}"):  # a catch-all: the rest of the path, slashes too
            pattern = pattern.removesuffix("[^/]+") + ".+"
        if re.fullmatch(pattern, shape):
            return True
    return False


@cache
def config_keys() -> set[str]:
    return {key.path.replace("[]", "") for key in all_keys()}


def _key_known(token: str) -> bool:
    """A config key path (``server.drain_delay_s``) exists, or ends one (``retry.attempts``)."""
    plain = token.replace("[]", "")
    return any(key == plain or key.endswith("." + plain) for key in config_keys())


def mentions(pattern: re.Pattern[str]) -> list[tuple[str, tuple[str, ...]]]:
    return [
        (doc.name, match.groups())
        for doc in DOCS
        for span in code_spans(doc)
        for match in pattern.finditer(span)
    ]


def test_every_gpugate_command_the_docs_name_exists() -> None:
    known = commands()
    wrong = []
    for doc, (words,) in mentions(_COMMAND):
        command, _, sub = words.partition(" ")
        if command not in known:
            wrong.append(f"{doc}: gpugate {command}")
        elif known[command] and sub and sub not in known[command] and not sub.startswith("-"):
            wrong.append(f"{doc}: gpugate {command} {sub}")
    assert [] == wrong


def test_every_route_the_docs_name_is_served(routes: set[tuple[str, str]]) -> None:
    wrong = [
        f"{doc}: {method} {path}"
        for doc, (method, path) in mentions(_ROUTE)
        if not _route_known(method, path, routes)
    ]
    assert [] == wrong


def test_every_config_key_the_docs_name_exists() -> None:
    top = {key.split(".")[0] for key in config_keys()}
    wrong = []
    for doc in (d for d in DOCS if d.name not in _ABOUT_THE_CODE):
        for span in code_spans(doc):
            token = span.strip("`").split(":")[0].strip()
            anchored = _KEY.match(token) and token.split(".")[0].replace("[]", "") in top
            if anchored and not _key_known(token):
                wrong.append(f"{doc.name}: {token}")
    assert [] == wrong


def test_the_readme_links_every_manual() -> None:
    text = README.read_text(encoding="utf-8")
    unlinked = [m.name for m in MANUALS if f"(docs/{m.name}" not in text]
    assert [] == unlinked


def test_the_checks_can_fail(routes: set[tuple[str, str]]) -> None:
    # a misspelt command, a route nobody serves and a key no model has are all caught
    assert "jbos" not in commands()
    assert not _route_known("GET", "/admin/nope", routes)
    assert _route_known("GET", "/admin/runtimes/{id}", routes)
    assert _route_known("POST", "/azure-di/documentintelligence/documentModels/m:analyze", routes)
    assert not _route_known("DELETE", "/v1/models", routes)
    assert not _key_known("server.drain_delay")
    assert _key_known("retry.attempts")


def test_the_at_least_once_window_is_one_figure_in_the_readme_the_manual_and_the_kill_test() -> (
    None
):
    """Issue #14 done-when 3: the README's figure is the one the kill test and
    ``bench/kill_window.py`` compare their measurement with (``DOCUMENTED_WINDOW_MS``)."""
    source = (ROOT / "tests" / "e2e" / "test_replicas_kill_window.py").read_text()
    [documented] = [
        ast.literal_eval(node.value)
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "DOCUMENTED_WINDOW_MS" for t in node.targets)
    ]
    for doc in (README, ROOT / "docs" / "jobs.md"):
        figures = {float(ms) for ms in re.findall(r"up to (\d+) ms", doc.read_text())}
        assert documented in figures, f"{doc.name} does not say 'up to {documented:g} ms'"
