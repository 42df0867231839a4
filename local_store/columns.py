"""Column lists and the SQL built from them, in one place.

The first 20 node columns are exactly the control plane's exported columns, in its order.
"""

from __future__ import annotations

import operator

from protocol.rows import EDGE_COLUMNS, NODE_EXPORT_COLUMNS, NODE_LATE_COLUMNS

NODE_WIRE = tuple(c for c in NODE_EXPORT_COLUMNS if c != "embedding") + NODE_LATE_COLUMNS
NODE_LOCAL = ("origin", "content_hash", "local_seq", "deleted", "dedupe_key", "source_uris",
              "mentions", "last_seen")
NODE_COLUMNS = NODE_WIRE + NODE_LOCAL

EDGE_LOCAL = ("updated_at", "origin", "content_hash", "local_seq", "deleted")
EDGE_ALL = EDGE_COLUMNS + EDGE_LOCAL


def upsert_sql(table: str, columns: tuple[str, ...]) -> str:
    names = ", ".join(columns)
    marks = ", ".join("?" for _ in columns)
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c != "id")
    return (f"INSERT INTO {table} ({names}) VALUES ({marks}) "
            f"ON CONFLICT (id) DO UPDATE SET {updates}")


def node_params(row: dict[str, object]) -> tuple[object, ...]:
    """Positional parameters for NODE_UPSERT/NODE_INSERT (positional binding is ~30% faster
    than named; ``itemgetter`` builds the tuple in C)."""
    return _NODE_ITEMS(row)  # type: ignore[no-any-return]


def edge_params(row: dict[str, object]) -> tuple[object, ...]:
    return tuple([row[c] for c in EDGE_ALL])


_NODE_ITEMS = operator.itemgetter(*NODE_COLUMNS)
NODE_UPSERT = upsert_sql("memories", NODE_COLUMNS)
NODE_INSERT = NODE_UPSERT.partition(" ON CONFLICT")[0]  # for ids the store has never held
EDGE_UPSERT = upsert_sql("edges", EDGE_ALL)
NODE_SELECT = "SELECT " + ", ".join(NODE_COLUMNS) + " FROM memories"
EDGE_SELECT = "SELECT " + ", ".join(EDGE_ALL) + " FROM edges"
