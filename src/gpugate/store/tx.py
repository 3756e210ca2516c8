"""Each transaction written once, as a generator, and run by a thin driver per backend.

A transaction is a generator (sans-IO): it yields ``(query, params)`` steps and receives each
step's :class:`Result`; what it returns is the transaction's answer. The SQLite driver runs the
whole generator on the store's one thread (one hop per transaction, under ``BEGIN IMMEDIATE``
for a write); the PostgreSQL driver awaits each step on a pooled connection. So the logic of a
transaction — read, decide, write — exists once; the drivers only move statements and rows.

Values go in as Python values (times aware, days as :class:`~datetime.date`, JSON wrapped in
:class:`~gpugate.store.dialect.Json`); the driver encodes them. What comes back is read with the
backend's :class:`Codec` (``store._codec``): SQLite hands back text where PostgreSQL has types.
A transaction that must undo what it wrote raises :class:`Rollback` with its answer.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from dataclasses import dataclass, fields
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from gpugate.errors import StoreError
from gpugate.store.dialect import POSTGRES, SQLITE

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Mapping, Sequence

    from _typeshed import DataclassInstance

    from gpugate.clock import Clock
    from gpugate.store.dialect import Query

T = TypeVar("T")
R = TypeVar("R", bound="DataclassInstance")

Row = tuple[Any, ...]


@dataclass(slots=True)
class Result:
    """What a step returned: its rows (none for a statement without any) and the row count."""

    rows: list[Row]
    rowcount: int

    def first(self) -> Row | None:
        return self.rows[0] if self.rows else None


SKIPPED = Result([], 0)
"""The result of a step its dialect skips (``None`` text)."""

if TYPE_CHECKING:
    Step = tuple[Query, Mapping[str, Any] | Sequence[Mapping[str, Any]]]
    Tx = Generator[Step, Result, T]


class Rollback(Exception):
    """Raised by a transaction to roll back everything it wrote and answer ``value``."""

    def __init__(self, value: object) -> None:
        super().__init__(value)
        self.value = value


@dataclass(frozen=True, slots=True)
class Codec:
    """How a backend hands values back: a time, a JSON document, a day."""

    dialect: str
    time: Callable[[Any], datetime]
    json: Callable[[Any], Any]
    day: Callable[[Any], date]


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


def _as_is(value: Any) -> Any:
    return value


SQLITE_CODEC = Codec(SQLITE, datetime.fromisoformat, json.loads, date.fromisoformat)
"""SQLite's: ISO-8601 text for times and days, JSON as text."""

POSTGRES_CODEC = Codec(POSTGRES, _utc, _as_is, _as_is)
"""PostgreSQL's: psycopg's own types, a time made UTC."""


def run(
    query: Query, params: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
) -> Tx[Result]:
    """One step: its :class:`Result` (a sequence of params: the statement once for each)."""
    return (yield query, {} if params is None else params)


class Last(dict[str, Any]):
    """The params of a transaction's last step, a write whose result it does not read (see
    :func:`last`)."""

    __slots__ = ()


def last(query: Query, params: Mapping[str, Any]) -> Tx[None]:
    """The transaction's last step, a write whose result is not read: the PostgreSQL driver
    sends ``COMMIT`` with it instead of a round trip later (the SQLite driver runs it as any)."""
    yield query, Last(params)


def rows(query: Query, params: Mapping[str, Any] | None = None) -> Tx[list[Row]]:
    """One step: its rows."""
    return (yield from run(query, params)).rows


def first(query: Query, params: Mapping[str, Any] | None = None) -> Tx[Row | None]:
    """One step: its first row, None when it returned none."""
    return (yield from run(query, params)).first()


def one(query: Query, params: Mapping[str, Any] | None = None) -> Tx[Row]:
    """One step that returns a row (an INSERT ... RETURNING): that row."""
    row = (yield from run(query, params)).first()
    if row is None:
        raise StoreError("the statement returned no row")
    return row


def count(query: Query, params: Mapping[str, Any] | None = None) -> Tx[int]:
    """One step: its row count."""
    return (yield from run(query, params)).rowcount


def read(c: Codec, kind: type[R], row: Row, **given: Reader) -> R:
    """A ``kind`` from ``row``: a dataclass whose fields are the row's columns, in order.

    A field's value is read by its annotation (postponed, so text) — a time, a day, a JSON
    document (``dict``) with the backend's codec — or by the reader ``given`` under its name;
    NULL stays None.
    """
    found = []
    for column, value in zip(fields(kind), row, strict=True):
        how = given.get(column.name) or _READERS.get(str(column.type))
        found.append(value if how is None or value is None else how(c, value))
    return kind(*found)


def values(record: DataclassInstance) -> dict[str, Any]:
    """A dataclass's fields by name: the parameters of the statement that stores it."""
    return {column.name: getattr(record, column.name) for column in fields(record)}


if TYPE_CHECKING:
    Reader = Callable[[Codec, Any], Any]

_READERS: dict[str, Reader] = {
    "datetime": lambda c, value: c.time(value),
    "datetime | None": lambda c, value: c.time(value),
    "date": lambda c, value: c.day(value),
    "dict[str, Any]": lambda c, value: c.json(value),
    "bool": lambda _, value: bool(value),
    "int": lambda _, value: int(value),
}


class Driven(Protocol):
    """What the store's parts (one per area) ask of the backend's driver."""

    _clock: Clock
    _codec: Codec
    _replica: str

    @property
    def _holder(self) -> str:
        """The ``leased_by`` tail of this store's claims (:class:`ReplicaStore`)."""
        ...

    @abstractmethod
    async def _transact(self, tx: Tx[T], *, single: bool = False) -> T:
        """Run a writing transaction (``single``: one statement, atomic alone)."""

    @abstractmethod
    async def _query(self, tx: Tx[T], *, single: bool = True) -> T:
        """Run a reading transaction (``single`` False: several statements, one snapshot)."""
