"""Staged outbox rows on their way to a plane: each with its entry, private memories kept on
this laptop where the plane would publish them, and a vector of the plane's model for every
memory the plane ranks.

Rules:
  * ``control_plane.private_memories``: "push" sends ``private:<agent>`` memories always,
    "local" never, "auto" only to a plane that returns a memory's space (a syncd hub, which
    names its model). One kept local is done with (its outbox entry acknowledged); its
    tombstone still goes, content scrubbed: the plane may hold an older, public version.
  * A Kyma plane ranks by the vector a row carries: a memory its recall can return (active,
    not invalidated) goes with a vector of the plane's model or not yet — embedded with the
    plane embedder, or held queued and counted (``push_awaiting_vector``, with what to do in
    ``push_vector_missing``). Archived, invalidated and deleted rows go as they are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec

from local_store.embed import Embedder
from local_store.replica import Entry
from protocol.rows import EdgeRow, NodeRow
from syncd.sync.context import NAMES_MODEL, Link
from syncd.sync.status import PassReport

PRIVATE_PREFIX = "private:"
Staged = list[tuple[Entry, NodeRow | EdgeRow]]  # staged entries with their wire rows


class Prepare:
    """Readies staged rows for the plane; holds the plane-model embedder once built."""

    def __init__(self, link: Link, plane_embedder: Callable[[], Embedder] | None) -> None:
        """``plane_embedder`` builds an embedder of the plane's model (it raises, saying what
        is missing, when it cannot)."""
        self.link = link
        self._factory = plane_embedder
        self._plane_embedder: Embedder | None = None

    async def keep_private_local(self, rows: Staged, report: PassReport) -> Staged:
        """A plane that cannot keep a memory's ``space`` serves it back to every laptop with
        none, visible to every agent there: a ``private:<agent>`` memory stays on this laptop
        (its outbox entry is done with, counted in ``push_kept_private``). Its tombstone still
        goes, content scrubbed: the plane may hold an older, public version."""
        private = [(entry, row) for entry, row in rows if isinstance(row, NodeRow)
                   and not row.deleted and (row.space or "").startswith(PRIVATE_PREFIX)]
        if not private:
            return rows
        await self.link.store.replication.ack_push([entry for entry, _ in private])
        report.push_kept_private += len(private)
        local = {id(entry) for entry, _ in private}
        return [(entry, row) for entry, row in rows if id(entry) not in local]

    async def plane_vectors(self, rows: Staged, model: str,
                            report: PassReport) -> tuple[Staged, set[str]]:
        """A Kyma plane takes the vector a row carries as it is and ranks by it: a vector of
        another model gets ranks it did not earn, and a zero vector (the "no vector" of a syncd
        hub) has a NULL cosine, which its semantic leg sorts first. So a memory the plane's
        recall can return (active, not invalidated) goes with a vector of the plane's model or
        not yet: one staged without (zeros) is embedded with ``plane_embedder``, or, when there
        is none, stays queued and is counted (``push_awaiting_vector``, with what to do in
        ``push_vector_missing``). Archived, invalidated and deleted rows, which the plane's
        recall never returns, go as they are."""
        missing = [i for i, (entry, row) in enumerate(rows) if isinstance(row, NodeRow)
                   and rankable(row) and not any(row.embedding or ())]
        if not missing:
            return rows, set()
        embedder, why = await self._model_embedder(model)
        if embedder is not None:
            texts = [rows[i][1].content or "" for i in missing]  # type: ignore[union-attr]
            try:
                vectors = await asyncio.to_thread(embedder.embed, texts)
            except Exception as exc:  # the model's files went missing, or it broke
                why = f"{model} failed: {exc}"
            else:
                out = list(rows)
                for i, vector in zip(missing, vectors, strict=True):
                    entry, row = rows[i]
                    out[i] = (entry, msgspec.structs.replace(
                        row, embedding=[float(x) for x in vector]))
                return out, set()
        report.push_vector_missing = why
        return rows, {label(rows[i][0]) for i in missing}

    async def _model_embedder(self, model: str) -> tuple[Embedder | None, str]:
        """An embedder of ``model`` (built once, off the loop: it looks for files), or None
        and why not, with what to do."""
        if self._plane_embedder is not None and self._plane_embedder.model_id == model:
            return self._plane_embedder, ""
        fix = (f"the plane ranks by {model}: give this laptop that model (embedding.model = "
               f"\"{model}\", or its files under embedding.cache_dir; docs/plane-vectors.md)")
        if self._factory is None:
            return None, fix
        try:
            embedder = await asyncio.to_thread(self._factory)
        except Exception as exc:  # EmbedderUnavailable names the package or files it lacks
            return None, f"{fix}: {exc}"
        if embedder.model_id != model:
            return None, f"{fix}: this laptop has {embedder.model_id}"
        self._plane_embedder = embedder
        return embedder, ""


def keeps_private(policy: str, state: dict[str, str]) -> bool:
    """``control_plane.private_memories``: "push" always, "local" never, "auto" to a plane
    that returns a memory's space (a syncd hub, which names its model)."""
    return policy == "push" or (policy == "auto" and bool(state.get(NAMES_MODEL)))


def rankable(row: NodeRow) -> bool:
    """Whether the plane's recall can return the row (its filters: not archived, not
    invalidated; a deleted row goes to Kyma as archived and invalidated)."""
    return not row.deleted and row.status != "archived" and row.invalid_at is None


def pair_rows(entries: list[Entry], nodes: list[NodeRow], edges: list[EdgeRow]) -> Staged:
    """Staged entries with their wire rows (``stage_push`` returns nodes, then edges)."""
    return [*zip([e for e in entries if e[0] == "node"], nodes, strict=True),
            *zip([e for e in entries if e[0] == "edge"], edges, strict=True)]


def label(entry: Entry) -> str:
    """How reports and status name a queued row: "node <id>", "edge <id>"."""
    return f"{entry[0]} {entry[1]}"

