"""Every statement written once and converted to each dialect at import (queries as data).

A statement is written once, in SQLite's ``:name`` parameter style (after procrastinate), and
:func:`sql` turns it into a :class:`Query` holding both dialects' texts. The conversion is small
and mechanical — and tested (``tests/store/test_store_dialect.py``):

* PostgreSQL: ``:name`` becomes psycopg's ``%(name)s`` (a literal ``%`` doubles), and SQLite's
  planner hint ``INDEXED BY <index>`` goes;
* SQLite: the row locks ``FOR UPDATE [OF t] [SKIP LOCKED]`` go (its single writer serialises
  every write transaction already), so do PostgreSQL's casts ``::type`` (which type a parameter
  given as NULL has), and ``greatest(`` is SQLite's scalar ``max(``.

A true difference (an upsert PostgreSQL writes as one CTE, ``LISTEN/NOTIFY``, an advisory lock)
is a named override: ``sql(text, postgres=other)``; ``None`` for a dialect skips the step there
(a lock SQLite has no need of). Values are bound, never formatted in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

SQLITE = "sqlite"
POSTGRES = "postgres"

_TABLE = re.compile(r"[a-z_][a-z0-9_]*")
_COLUMN_LIST = re.compile(r"[\w\s,.=:]*")
_FRAGMENT = re.compile(r"\{(\w+)\}")
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_INDEXED_BY = re.compile(r"\s+INDEXED BY \w+")
_FOR_UPDATE = re.compile(r"\s+FOR UPDATE(?: OF \w+)?(?: SKIP LOCKED)?")
_GREATEST = re.compile(r"\bgreatest\(")
_CAST = re.compile(r"::\w+(?:\[\])?")


@dataclass(frozen=True, slots=True)
class Query:
    """One statement in each dialect; ``None`` where the dialect skips it."""

    sqlite: str | None
    postgres: str | None


class Json:
    """A parameter stored as JSON (text on SQLite, jsonb on PostgreSQL)."""

    __slots__ = ("value",)  # a plain class: one is made for most values written, fast

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Json({self.value!r})"


def to_postgres(text: str) -> str:
    """``text`` in psycopg's parameter style, without SQLite's planner hints."""
    return _PARAM.sub(r"%(\1)s", _INDEXED_BY.sub("", text).replace("%", "%%"))


def to_sqlite(text: str) -> str:
    """``text`` without row locks, with SQLite's names of the functions that differ."""
    return _GREATEST.sub("max(", _CAST.sub("", _FOR_UPDATE.sub("", text)))


_SAME: Any = object()


def sql(
    text: str, *, sqlite: str | None = _SAME, postgres: str | None = _SAME, **columns: str
) -> Query:
    """The :class:`Query` of ``text``; ``sqlite``/``postgres`` override one dialect (written in
    the same ``:name`` style and converted alike), ``None`` skips the statement there.

    ``columns`` are fragments the texts hold as ``{name}`` — a list of columns written once
    for the statements that read the same row, a condition on a parameter —, checked to hold
    names, commas, ``=`` and ``:params`` only: never a literal, so never a value.
    """
    for name, listed in columns.items():
        if not _COLUMN_LIST.fullmatch(listed):
            raise ValueError(f"{name} is not a list of column names: {listed!r}")

    def fill(found: re.Match[str]) -> str:
        return columns.get(found[1], found[0])

    lite = text if sqlite is _SAME else sqlite
    pg = text if postgres is _SAME else postgres
    lite = None if lite is None else _FRAGMENT.sub(fill, lite)
    pg = None if pg is None else _FRAGMENT.sub(fill, pg)
    return Query(None if lite is None else to_sqlite(lite), None if pg is None else to_postgres(pg))


def only_postgres(text: str, **columns: str) -> Query:
    """A statement PostgreSQL needs and SQLite has no use for (a lock, a ``NOTIFY``)."""
    return sql(text, sqlite=None, **columns)


def count_rows(table: str) -> Query:
    """``SELECT count(*)`` of a table named by the catalog: the one statement with a name in it
    (an identifier cannot be bound), refused unless it is a plain lower-case name."""
    if not _TABLE.fullmatch(table):
        raise ValueError(f"not a plain table name: {table!r}")
    return sql("SELECT count(*) FROM " + table)  # noqa: S608 - a checked identifier, no value
