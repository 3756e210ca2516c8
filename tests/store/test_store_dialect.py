"""The converter that turns each statement, written once, into both dialects."""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest

import gpugate.store
from gpugate.store.dialect import Query, count_rows, only_postgres, sql, to_postgres, to_sqlite


def test_a_named_parameter_becomes_psycopgs_style_and_a_literal_percent_doubles() -> None:
    text = "SELECT 1 FROM t WHERE a = :a AND b LIKE 'c:%' AND c = :c_2"
    assert "SELECT 1 FROM t WHERE a = %(a)s AND b LIKE 'c:%%' AND c = %(c_2)s" == to_postgres(text)


def test_a_postgres_cast_is_no_parameter_and_goes_on_sqlite() -> None:
    text = "SELECT :x::text IS NULL, '{}'::jsonb, unnest(:slugs::text[])"
    assert "SELECT %(x)s::text IS NULL, '{}'::jsonb, unnest(%(slugs)s::text[])" == to_postgres(text)
    assert "SELECT :x IS NULL, '{}', unnest(:slugs)" == to_sqlite(text)


def test_row_locks_go_on_sqlite_and_planner_hints_on_postgres() -> None:
    text = "SELECT id FROM jobs INDEXED BY jobs_claim WHERE a LIMIT 3 FOR UPDATE OF e SKIP LOCKED"
    assert "SELECT id FROM jobs WHERE a LIMIT 3 FOR UPDATE OF e SKIP LOCKED" == to_postgres(text)
    assert "SELECT id FROM jobs INDEXED BY jobs_claim WHERE a LIMIT 3" == to_sqlite(text)
    assert "SELECT 1 FROM t WHERE a = 1" == to_sqlite("SELECT 1 FROM t WHERE a = 1 FOR UPDATE")


def test_greatest_is_sqlites_scalar_max() -> None:
    assert "SET cents = max(0, cents + :d)" == to_sqlite("SET cents = greatest(0, cents + :d)")


def test_an_override_replaces_one_dialect_and_none_skips_the_statement_there() -> None:
    query = sql("SELECT :a", postgres="SELECT :b")
    assert Query("SELECT :a", "SELECT %(b)s") == query
    assert Query(None, "LOCK TABLE t") == only_postgres("LOCK TABLE t")


def test_a_fragment_fills_its_place_in_both_dialects_and_never_holds_a_literal() -> None:
    query = sql("SELECT {cols} FROM jobs WHERE id = :id {only}", cols="id, slug", only="")
    assert (
        Query(
            "SELECT id, slug FROM jobs WHERE id = :id ",
            "SELECT id, slug FROM jobs WHERE id = %(id)s ",
        )
        == query
    )
    with pytest.raises(ValueError, match="not a list of column names"):
        sql("SELECT {cols} FROM jobs", cols="slug FROM jobs WHERE slug = 'x' --")


def test_a_table_count_refuses_anything_but_a_plain_name() -> None:
    assert "SELECT count(*) FROM jobs" == count_rows("jobs").sqlite
    with pytest.raises(ValueError, match="plain table name"):
        count_rows('jobs"; DROP TABLE jobs; --')


def _queries() -> list[tuple[str, Query]]:
    found = []
    for info in pkgutil.iter_modules(gpugate.store.__path__):
        if info.name in {"sqlite", "postgres"} or info.name.startswith(("sqlite_", "postgres_")):
            continue
        module = importlib.import_module(f"gpugate.store.{info.name}")
        found += [(f"{info.name}.{n}", q) for n, q in vars(module).items() if isinstance(q, Query)]
    return found


def test_every_statement_of_the_store_converted_to_each_dialects_parameter_style() -> None:
    queries = _queries()
    assert len(queries) > 20
    for name, query in queries:
        if query.sqlite is not None:
            assert "%(" not in query.sqlite, name
            assert "FOR UPDATE" not in query.sqlite, name
        if query.postgres is not None:
            assert not re.search(r"(?<![:\w]):[A-Za-z_]", query.postgres), name
            assert "INDEXED BY" not in query.postgres, name
