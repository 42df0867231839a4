"""The hub on PostgreSQL (``syncd hub --store postgresql://…``): several stateless hub
processes on one database.

Rules:
  * Every write transaction draws a ``tx`` id when it starts and stamps every row it writes
    with it. Just before commit it calls ``hub_feed_mark`` (``schema/0001_hub.sql``), which
    takes a transaction-scoped advisory lock, draws the next feed ``seq`` and records
    ``(tx, seq, stamp)``. The lock is held until the commit, so no transaction can draw a later
    seq and commit before this one: seq order **is** commit order, and a reader that asks for
    ``seq > cursor`` never skips a row that becomes visible later. Only the mark and the commit
    are serialised; the rows themselves are written by all processes in parallel.
    (The alternative — readers held below ``pg_snapshot_xmin`` with transaction ids as the
    position — breaks after ``pg_dump``/restore: ids are stored data, and a restored cluster
    hands out smaller ones. Sequences are restored with their values.)
  * ``since``/``until`` stay canonical timestamps: a mark's ``stamp_ns`` is later than every
    earlier mark's, whatever the clocks of the processes, so ``until`` never goes backwards
    except when a client's ``since`` is not a mark of this database (a wiped or restored hub):
    then, as on SQLite, the answer is the mark before it and no rows.
  * Last-writer-wins is decided by the database: the upsert's ``WHERE`` compares version keys
    ``(updated_at, origin, content_hash)`` in byte order (``COLLATE "C"``), so two processes
    importing the same id concurrently keep the same winner every replica keeps.
  * An import takes its row locks in one order in every process — the batch's stored memories
    by id (``FOR UPDATE``), the memories' upsert by id, then the same for edges — so two
    imports of the same ids wait for each other, not deadlock; what a row replaces (its
    content: is the vector stale?) is read under that lock. A transaction PostgreSQL aborts
    anyway (deadlock, serialization failure) runs again, a few times; then, like a lost
    connection, a full pool or a cancelled statement, it is an outage: 503 + Retry-After.
  * Export pages (``export_page``) are keyed on (feed seq, nodes before edges, id), so
    ``limit`` bounds a page even inside one large import. A cursor is the seq alone when the
    page ends on an import's boundary (the only form older hubs gave), else ``<seq>.n<hex id>``
    or ``<seq>.e<hex id>``. The feed still pages on transaction boundaries.
  * A row's words are split by the laptops' tokeniser in Python and stored as a ``tsvector``
    (GIN index); vectors live in ``vectors`` and every hub process keeps its own float32 index
    of them, following the feed (``recall.py``).
  * An import that wrote rows sends ``NOTIFY syncd_hub_feed`` in its transaction (delivered
    at its commit); every serving process ``LISTEN``s on a connection of its own and wakes
    its held ``changes?wait=`` polls (``syncd/hub/longpoll.py``), which read the feed again.
    A lost listening connection is reconnected (and checked every ``LISTEN_CHECK_SECS``);
    meanwhile held polls answer at their timeout, never later.
  * Nothing lives in a hub process between requests: tokens, the signing key, settings,
    counters and the web page's sessions are rows, read when needed.

Where: the marks, the upsert and the lock order in ``imports.py``; ``since``/``until`` and the
export pages in ``feed.py``; the vector index and ``LISTEN`` in ``follow.py``; settings,
counters, the key and sessions in ``settings.py``; ``store.py`` wires them into the hub-store
interface (``syncd/hub/store.py``).
"""

from syncd.hub.pg.store import PgHubStore

__all__ = ["PgHubStore"]
