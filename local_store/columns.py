"""Column lists and the SQL built from them, in one place.

The first 20 node columns are exactly the control plane's exported columns, in its order.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from protocol.rows import EDGE_COLUMNS, NODE_EXPORT_COLUMNS, NODE_LATE_COLUMNS

NODE_WIRE = tuple(c for c in NODE_EXPORT_COLUMNS if c != "embedding") + NODE_LATE_COLUMNS
NODE_LOCAL = ("origin", "content_hash", "local_seq", "deleted", "dedupe_key", "source_uris",
              "mentions", "last_seen", "base_version")
NODE_COLUMNS = NODE_WIRE + NODE_LOCAL
NODE_ID = NODE_COLUMNS.index("id")  # where a node row's id sits

EDGE_LOCAL = ("updated_at", "origin", "content_hash", "local_seq", "deleted")
EDGE_ALL = EDGE_COLUMNS + EDGE_LOCAL


def upsert_sql(table: str, columns: tuple[str, ...],
               nulls: tuple[bool, ...] | None = None) -> str:
    """``nulls[i]``: column i is a literal NULL in the statement instead of a parameter."""
    names = ", ".join(columns)
    marks = ", ".join("NULL" if nulls and nulls[i] else "?" for i in range(len(columns)))
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c != "id")
    return (f"INSERT INTO {table} ({names}) VALUES ({marks}) "
            f"ON CONFLICT (id) DO UPDATE SET {updates}")


def node_params(row: dict[str, object]) -> tuple[object, ...]:
    """Positional parameters for NODE_UPSERT/NODE_INSERT (positional binding is faster
    than named; ``itemgetter`` builds the tuple in C)."""
    return _NODE_ITEMS(row)  # type: ignore[no-any-return]


def node_batches(rows: Iterable[dict[str, object]], *,
                 upsert: bool) -> list[tuple[str, list[tuple[object, ...]]]]:
    """(statement, parameters) per pattern of NULL columns, for ``executemany``.

    Python's sqlite3 looks for an adapter before it binds a None (~0.45 us each, against
    ~0.1 us for a str): a remote row has ~12 NULL columns, so binding them costs more than
    the INSERT itself. Each row's NULLs become literals in a statement for its pattern
    instead; a batch from one writer has one or a few patterns.

    A row is first tried against the previous row's pattern: two ``itemgetter`` calls and a
    ``None in`` test, in C, instead of two comprehensions over every column. ``None in kept`` is never False when ``kept`` holds a None, and the NULL
    columns are compared by identity, so a row whose pattern differs takes the full path."""
    groups: dict[tuple[bool, ...], list[tuple[object, ...]]] = {}
    last: _Pattern | None = None
    for row in rows:
        if last is not None:
            kept = last.kept(row)
            if None not in kept and all(map(operator.is_, last.nulls(row), last.all_null)):
                groups[last.key].append(kept)
                continue
        values = _NODE_ITEMS(row)
        nulls = tuple([value is None for value in values])
        kept = tuple([value for value in values if value is not None])
        last = _pattern(nulls)
        found = groups.get(nulls)
        if found is None:
            groups[nulls] = [kept]
        else:
            found.append(kept)
    return [(_node_sql(nulls, upsert), params) for nulls, params in groups.items()]


@dataclass(frozen=True, slots=True)
class _Pattern:
    """One pattern of NULL node columns: ``kept`` gives a row's other columns, ``nulls`` its
    NULL ones, as tuples (``all_null`` when the row has this pattern)."""
    key: tuple[bool, ...]
    kept: Callable[[dict[str, object]], tuple[object, ...]]
    nulls: Callable[[dict[str, object]], tuple[object, ...]]
    all_null: tuple[None, ...]


@functools.lru_cache(maxsize=512)
def _pattern(nulls: tuple[bool, ...]) -> _Pattern:
    kept = [name for name, null in zip(NODE_COLUMNS, nulls, strict=True) if not null]
    dropped = [name for name, null in zip(NODE_COLUMNS, nulls, strict=True) if null]
    return _Pattern(nulls, _tuple_getter(kept), _tuple_getter(dropped), (None,) * len(dropped))


def _tuple_getter(names: list[str]) -> Callable[[dict[str, object]], tuple[object, ...]]:
    """``itemgetter(*names)``, but always answering a tuple (of one, or none, too)."""
    if len(names) > 1:
        return operator.itemgetter(*names)
    return lambda row: tuple([row[name] for name in names])


@functools.lru_cache(maxsize=512)
def _node_sql(nulls: tuple[bool, ...], upsert: bool) -> str:
    sql = upsert_sql("memories", NODE_COLUMNS, nulls)
    return sql if upsert else sql.partition(" ON CONFLICT")[0]


def edge_params(row: dict[str, object]) -> tuple[object, ...]:
    return tuple([row[c] for c in EDGE_ALL])


_NODE_ITEMS = operator.itemgetter(*NODE_COLUMNS)
NODE_UPSERT = upsert_sql("memories", NODE_COLUMNS)
EDGE_UPSERT = upsert_sql("edges", EDGE_ALL)
NODE_SELECT = "SELECT " + ", ".join(NODE_COLUMNS) + " FROM memories"
EDGE_SELECT = "SELECT " + ", ".join(EDGE_ALL) + " FROM edges"
