"""Apply a batch of remote rows (a pulled delta, an export, a file import).

Rules:
  * Idempotent and order-independent: a row is written only if its version key
    ``(updated_at, origin, content_hash)`` beats the local one (``merge.wins``).
  * Remote text is redacted like local text (the plane does not redact imports, RELIABILITY P5),
    and the preview is recomputed from the redacted content.
  * One bad row is reported (index, id, field, message) and skipped; the rest apply. A text
    no UTF-8 can hold (a lone surrogate), an importance that is not a number or is an integer
    beyond float range, are such rows: the batch never fails for one row.
  * A vector of the receiving store's own model must be of that model's width (``dim``), as the
    plane requires of every row (contract §4.4): another width is a bad row naming
    ``embedding``. Vectors of another model (a plane's, pulled) keep the width they came with.
    Zeros of any width are "no vector", as a missing embedding is: nothing is stored for them.
  * A row that loses last-writer-wins may still be a concurrent version: ``versions`` keeps it
    as a conflict when the local winner was not written over it (the ``base`` extension).
  * Timestamps are stored canonical; a row without a parseable ``updated_at`` is rejected.
  * Rows from a writer that sent no ``origin`` (the control plane's own) get origin ``""``.
  * Edges are upserted by their deterministic id; the edge's wire ``created_at`` is its version
    unless the syncd extension ``updated_at`` is present. ``props`` with ``"deleted": true`` is
    the plane's edge tombstone.
"""

from __future__ import annotations

import gc
import json
import math
import operator
import struct
import threading
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass, field

import msgspec
import numpy as np
import numpy.typing as npt

from local_store import versions as history
from local_store.db import chunks, marks
from local_store.errors import ValidationError
from local_store.floats import float32_rows
from local_store.merge import NODE_HASHED, hash_values, hashed_values, wins
from local_store.records import (
    DEFAULT_IMPORTANCE,
    MEMORY_TYPES,
    STATUSES,
    parse_timestamp,
    preview,
    refuse_private_id,
)
from local_store.redact import (
    is_text,
    refuse_lone_surrogate,
    strip_private,
    strip_private_json_text,
)
from local_store.writes import Row, Vector, Writer
from protocol.rows import EdgeRow, NodeRow, edge_id
from protocol.timestamp import format_ns

_NODE_TEXT = ("labels", "realm", "memory_type", "title", "content", "tags", "status",
              "source_session_id", "source_run_id", "superseded_by", "provenance", "topic_key",
              "memory_class", "space", "writer_agent_id")
_NODE_TEXT_ATTRS = operator.attrgetter(*_NODE_TEXT)


@dataclass(slots=True)
class RowProblem:
    kind: str
    index: int
    id: str | None
    field: str | None
    message: str


@dataclass(slots=True)
class ApplyResult:
    applied_nodes: int = 0
    applied_edges: int = 0
    skipped_nodes: int = 0
    skipped_edges: int = 0
    problems: list[RowProblem] = field(default_factory=list)
    max_version: str | None = None
    bound: str = ""
    max_within: str | None = None
    beyond_drift: list[str] = field(default_factory=list)


def _text(value: object, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(name, f"must be a string, got {type(value).__name__}")
    refuse_lone_surrogate(value, name)
    return strip_private(value) if "<" in value else value


def node_from_wire(wire: NodeRow, key: WireKey | None = None) -> Row:
    """Validate and redact one remote node row into a store row (its vector comes later).

    ``key`` is ``wire_key(wire)`` when already computed: if normalising left every hashed
    value as the wire had it (the common case), its hash is the row's and is not recomputed.
    This runs for every pulled row, so it avoids per-field helper calls on the common path,
    works on locals and builds the row in one dict display rather than a key at a time.
    """
    mid = wire.id
    if not isinstance(mid, str) or not mid.strip():
        raise ValidationError("id", "is required and must be a non-empty string")
    if "<" in mid or not mid.isascii():  # else neither a tag nor a lone surrogate is there
        refuse_private_id(mid, "id")
    updated = parse_timestamp(wire.updated_at, "updated_at")
    if updated is None:
        raise ValidationError("updated_at", "is required")
    texts = _NODE_TEXT_ATTRS(wire)
    try:  # one join tells whether every text is a string without a "<" and UTF-8 can hold
        joined = "".join([value for value in texts if value is not None])  # (the common case)
        clean = "<" not in joined and (joined.isascii() or is_text(joined))
    except TypeError:
        clean = False
    if not clean:
        texts = tuple(_redacted_texts(texts))
    (labels, realm, kind, title, content, tags, status, session, run, superseded_by, provenance,
     topic_key, memory_class, space, writer_agent) = texts
    if provenance is not None and ("<" in provenance or "\\" in provenance):
        provenance = strip_private_json_text(provenance, "provenance")  # (else it is its own)
    raw_created = wire.created_at
    created = updated if raw_created == wire.updated_at else (
        parse_timestamp(raw_created, "created_at") or updated)
    raw_valid = wire.valid_at
    valid = created if raw_valid is not None and raw_valid == raw_created else (
        parse_timestamp(raw_valid, "valid_at"))
    invalid = wire.invalid_at
    if invalid is not None:
        invalid = parse_timestamp(invalid, "invalid_at")
    if kind not in MEMORY_TYPES:
        kind = (kind or "").strip().lower()
        kind = kind if kind in MEMORY_TYPES else "fact"
    if status not in STATUSES:
        status = (status or "").strip().lower()
        status = status if status in STATUSES else "active"
    content = content or ""
    importance = wire.importance
    if importance.__class__ is not float or not math.isfinite(importance):
        importance = _wire_importance(importance)
    origin = wire.origin
    if origin is not None:
        origin = _text(origin, "origin")
    row: Row = {  # the keys in the order every node row has had them
        "labels": labels, "realm": realm or "default", "memory_type": kind, "title": title,
        "content": content, "tags": tags or "", "status": status,
        "source_session_id": session, "source_run_id": run, "superseded_by": superseded_by,
        "provenance": provenance, "topic_key": topic_key, "memory_class": memory_class,
        "space": space, "writer_agent_id": writer_agent, "id": mid.strip(),
        "created_at": created, "valid_at": valid, "invalid_at": invalid, "updated_at": updated,
        "content_preview": preview(content), "importance": min(1.0, max(0.0, importance)),
        "origin": origin or "", "deleted": 1 if wire.deleted else 0, "local_seq": 0,
        "dedupe_key": None, "source_uris": None, "mentions": None, "last_seen": None,
        "base_version": _wire_base(wire.base),
    }
    values = hashed_values(row)
    row["content_hash"] = key[1] if key is not None and _hash_alike(values, key[0]) else (
        hash_values(values))
    return row


def _wire_base(value: object) -> str | None:
    """The ``base`` extension (the version a row was written over, ``""``: none) as stored;
    anything that is not a timestamp says nothing and is stored as unknown (None): the row
    itself is fine, and only conflict detection reads it (``versions``)."""
    if value is None:
        return None
    if value == "":
        return ""
    try:
        return parse_timestamp(value, "base")
    except ValidationError:
        return None


def _redacted_texts(texts: tuple[str | None, ...]) -> list[str | None]:
    """``node_from_wire``'s texts when some is not clean: each checked, every one but
    provenance (JSON text, redacted as such by the caller) redacted."""
    out = list(texts)
    for index, (name, value) in enumerate(zip(_NODE_TEXT, texts, strict=True)):
        if value is not None:
            if value.__class__ is not str:
                raise ValidationError(name, f"must be a string, got {type(value).__name__}")
            refuse_lone_surrogate(value, name)
            if "<" in value and name != "provenance":
                out[index] = strip_private(value)
    return out


def _wire_importance(value: object) -> float:
    """A remote importance that is not a finite float: absent, NaN or infinite is the default;
    an integer is its float; anything else (a string, an integer beyond float range) is a bad
    row."""
    if value is None:
        return DEFAULT_IMPORTANCE
    if not isinstance(value, int | float):
        raise ValidationError("importance", f"must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        raise ValidationError("importance", "must be a finite number") from None
    return number if math.isfinite(number) else DEFAULT_IMPORTANCE


def _hash_alike(values: tuple[object, ...], wire: tuple[object, ...]) -> bool:
    """Do ``values`` (a row's) and ``wire`` (its wire row's) hash alike? The types agree (str
    or None texts, float importance, int deleted — in both), and equal values of one type
    print alike, but for one case: 0.0 == -0.0, printed "0.0" and "-0.0" (the row's clamp
    turns -0.0 into 0.0), so importance is compared as printed."""
    return values == wire and str(values[_IMPORTANCE]) == str(wire[_IMPORTANCE])


def redacted_text(wire: NodeRow, row: Row) -> bool:
    """Did redaction change the row's text? Then a vector that came with it was computed from
    the private span (by a writer that does not redact, like the plane) and must not be kept.
    (An unredacted text is the wire's own string object, so ``is`` settles the common case.)"""
    if wire.content is row["content"] and wire.title is row["title"] and (
            wire.tags is row["tags"]):
        return False
    for value, kept in ((wire.content, row["content"]), (wire.title, row["title"]),
                        (wire.tags, row["tags"])):
        if value is not None and value is not kept and "<" in value and value != kept:
            return True
    return False


WireKey = tuple[tuple[object, ...], str]


def wire_key(wire: NodeRow) -> WireKey | None:
    """The row's hashed values as it came, with only the trivial defaults applied, and their
    hash — or None for a row too malformed to hash (the full path then reports it)."""
    values = list(_HASHED_ATTRS(wire))
    values[_DELETED] = 1 if wire.deleted else 0
    values[_CREATED] = values[_CREATED] or wire.updated_at
    values[_TAGS] = values[_TAGS] or ""
    try:
        if values[_IMPORTANCE] is not None:
            values[_IMPORTANCE] = float(values[_IMPORTANCE])
        return tuple(values), hash_values(values)
    except (TypeError, ValueError, OverflowError):  # a lone surrogate is a UnicodeEncodeError
        return None


def wire_keys(nodes: list[NodeRow], stop: threading.Event | None = None,
              ) -> list[WireKey | None]:
    """``wire_key`` of each row in order, until ``stop`` is set (looked at every
    ``HASH_CHUNK`` rows): then of the rows before that point only."""
    keys: list[WireKey | None] = []
    for chunk in chunks(nodes, HASH_CHUNK):
        if stop is not None and stop.is_set():
            break
        keys += [wire_key(wire) for wire in chunk]
    return keys


def already_held(wire: NodeRow, key: WireKey | None, current: tuple[str, str, str]) -> bool:
    """Re-apply fast path: is ``wire`` (whose ``wire_key`` is ``key``) exactly the version
    this replica holds?

    If the wire row's hash equals the stored key's, the row *is* the stored (normalised) row
    field for field, so normalising it would give the same key and the full path would skip
    it too. Any row that needs real normalising (another timestamp form, redaction, an
    unknown type) hashes differently and takes the full path — slower, never wrong.
    """
    return (key is not None and wire.updated_at == current[0]
            and (wire.origin or "") == current[1] and key[1] == current[2])


HELPER_FROM = 256
HASH_CHUNK = 256
_HASHED_ATTRS = operator.attrgetter(*NODE_HASHED)
_DELETED, _CREATED, _TAGS, _IMPORTANCE = (
    NODE_HASHED.index(name) for name in ("deleted", "created_at", "tags", "importance"))


def vector_from_wire(wire: NodeRow) -> npt.NDArray[np.float32] | None:
    """The row's embedding, or None when absent or all zeros (the plane's "no vector").

    ``struct`` packs a list of floats into little-endian float32 about twice as fast as
    ``np.asarray``; the array is then a zero-copy view of those bytes.
    """
    if wire.embedding is None or wire.deleted:
        return None
    dim = len(wire.embedding)
    packer = _PACKERS.get(dim) or _PACKERS.setdefault(dim, struct.Struct(f"<{dim}f"))
    try:
        values = np.frombuffer(packer.pack(*wire.embedding), dtype="<f4")
    except (struct.error, TypeError, OverflowError):
        raise ValidationError("embedding", "must be an array of finite numbers") from None
    if not np.isfinite(values).all():
        raise ValidationError("embedding", "must be an array of finite numbers")
    return values if values.any() else None


_PACKERS: dict[int, struct.Struct] = {}


def check_width(wire: NodeRow, dim: int | None) -> None:
    """Refuse a vector that is not ``dim`` wide (``dim`` None: any width), a tombstone's too:
    a hub would serve it to clients that refuse the whole pull for it (a Kyma client). Zeros
    are no vector whatever their width (nothing is stored, and what is served has the right
    width): a laptop on another model pushes the zeros of the width it assumes the plane's."""
    embedding = wire.embedding
    if dim is not None and embedding is not None and len(embedding) != dim and any(embedding):
        raise ValidationError("embedding", f"must be an array of {dim} numbers, "
                              f"got {len(embedding)}")


def edge_from_wire(wire: EdgeRow) -> Row:
    """Validate one remote edge. Its endpoints and type are identity: a private span there
    refuses the row (ids are never rewritten); the id must be ``{src}->{dst}:{type}``."""
    for name in ("src", "dst", "type"):
        value = getattr(wire, name)
        if not isinstance(value, str) or not value.strip():
            raise ValidationError(name, "is required and must be a non-empty string")
        refuse_private_id(value, name)
    src, dst, type_ = wire.src or "", wire.dst or "", wire.type or ""
    eid = edge_id(src, dst, type_)
    if wire.id is not None and wire.id != eid:
        raise ValidationError("id", "must be {src}->{dst}:{type}")
    version = parse_timestamp(wire.updated_at, "updated_at") or parse_timestamp(
        wire.created_at, "created_at")
    if version is None:
        raise ValidationError("created_at", "is required")
    props = wire.props
    if props is not None:  # JSON text: its strings are redacted, not its raw characters
        if not isinstance(props, str):
            raise ValidationError("props", f"must be a string, got {type(props).__name__}")
        refuse_lone_surrogate(props, "props")
        props = strip_private_json_text(props, "props")
    deleted = bool(wire.deleted) or _props_say_deleted(props)
    return {
        "id": eid, "src": src, "dst": dst, "type": type_,
        "realm": _text(wire.realm, "realm"),
        "target_namespace": _text(wire.target_namespace, "target_namespace"),
        "props": props, "created_at": parse_timestamp(wire.created_at, "created_at") or version,
        "updated_at": version, "origin": _text(wire.origin, "origin") or "",
        "deleted": int(deleted), "local_seq": 0,
    }


def safe_id(value: object) -> str | None:
    """An id as it may appear in an error report: never with private content in it, and
    always text a report can be encoded in (a lone surrogate is spelled ``\\ud800``)."""
    if not isinstance(value, str):
        return None
    if not value.isascii() and not is_text(value):
        value = value.encode("utf-8", "backslashreplace").decode()
    return strip_private(value)


def _props_say_deleted(props: str | None) -> bool:
    if not props or "deleted" not in props:
        return False
    try:
        parsed = json.loads(props)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("deleted") is True


def apply_batch(writer: Writer, nodes: list[NodeRow], edges: list[EdgeRow],
                model: str, hasher: Executor | None = None, *,
                dim: int | None = None, kept: tuple[str, ...] = ()) -> ApplyResult:
    """Run inside the writer's transaction. Nodes first, then edges (endpoints may be absent).
    ``dim``: the width ``model``'s vectors must have, when known (``check_width``). ``kept``:
    node columns the sender never returns (``held_columns``).

    ``hasher``, a thread of its own, hashes the wire rows while this thread looks up their
    stored keys: that lookup is one SQLite statement, which runs without the GIL (a 10k-row
    re-apply takes ~20% less time). A batch of fewer than ``HELPER_FROM`` rows is hashed
    here: handing it over would cost more than it saves. Once the lookup is answered, the
    hasher stops, and of the rows it had not reached only those the store holds are hashed
    (``already_held`` needs their key): any other row is normalised anyway, and
    ``node_from_wire`` hashes it once (hashing every wire row made a fresh apply slower; a
    re-apply is unchanged).

    A batch of ``HELPER_FROM`` rows or more runs with Python's cyclic garbage collector paused
    (``gc_paused``): its row dicts and tuples, allocated by the ten thousand and nearly all
    freed by reference counting, triggered full collections that walked every live object —
    each pulled row's 384-float embedding list included."""
    with gc_paused(len(nodes) + len(edges) >= HELPER_FROM):
        if kept:
            nodes = held_columns(writer, nodes, kept)
        return _apply_batch(writer, nodes, edges, model, hasher, dim)


def held_columns(writer: Writer, nodes: list[NodeRow], columns: tuple[str, ...]) -> list[NodeRow]:
    """Rows from a sender that never returns ``columns`` (a Kyma plane's ``changes`` and
    ``export`` select a fixed list without ``space``, ``memory_class``, ``writer_agent_id``):
    there a missing value says nothing, so where a row has none, the value this store holds
    for its id stays. Without it, a pulled version of a ``private:<agent>`` memory made it
    visible to every agent. None of these columns is hashed (``merge.NODE_HASHED``): an echo of
    a row this store holds is still recognised as held."""
    wanted = [w.id.strip() for w in nodes if isinstance(w.id, str)
              and any(getattr(w, c) is None for c in columns)]
    if not wanted:
        return nodes
    held: dict[str, tuple[object, ...]] = {}
    for chunk in chunks(wanted):
        for r in writer.conn.execute(f"SELECT id, {', '.join(columns)} FROM memories "
                                     f"WHERE id IN ({marks(chunk)})", chunk):
            held[r[0]] = tuple(r[1:])
    out = []
    for w in nodes:
        values = held.get(w.id.strip()) if isinstance(w.id, str) else None
        fill = {c: v for c, v in zip(columns, values or (), strict=False)
                if v is not None and getattr(w, c) is None}
        out.append(msgspec.structs.replace(w, **fill) if fill else w)
    return out


@contextmanager
def gc_paused(pause: bool) -> Iterator[None]:
    """No automatic cyclic collection inside (when ``pause``); reference counting still frees
    what it frees. Process-wide, so only around bounded work; restored as it was."""
    enabled = pause and gc.isenabled()
    if enabled:
        gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _apply_batch(writer: Writer, nodes: list[NodeRow], edges: list[EdgeRow],
                 model: str, hasher: Executor | None, dim: int | None) -> ApplyResult:
    result = ApplyResult(bound=format_ns(writer.clock.physical_ns() + writer.clock.max_drift_ns))
    ids = [wire.id.strip() if isinstance(wire.id, str) else "" for wire in nodes]
    stop = threading.Event()
    hashing = (hasher.submit(wire_keys, nodes, stop)
               if hasher is not None and len(nodes) >= HELPER_FROM else None)
    known = writer.current_keys("memories", [mid for mid in ids if mid])
    stop.set()
    keys = hashing.result() if hashing is not None else []
    keys += [wire_key(wire) if mid in known else None
             for wire, mid in zip(nodes[len(keys):], ids[len(keys):], strict=True)]
    stored = set(known)  # before this batch: ids not in it get plain INSERTs
    held = [current is not None and already_held(wire, key, current)
            for wire, mid, key in zip(nodes, ids, keys, strict=True)
            for current in (known.get(mid),)]
    batch = vectors_from_wires([wire for wire, h in zip(nodes, held, strict=True) if not h])
    winners: dict[str, tuple[Row, Vector | None]] = {}
    versions: list[str] = []  # every version seen, for the clock (noted once, below)
    fresh = 0
    losers: list[Row] = []
    for index, wire in enumerate(nodes):
        if held[index]:
            versions.append(known[ids[index]][0])
            result.skipped_nodes += 1
            continue
        fresh += 1
        try:
            row = node_from_wire(wire, keys[index])
            key = (row["updated_at"], row["origin"], row["content_hash"])
            versions.append(key[0])
            if not wins(key, known.get(row["id"])):
                result.skipped_nodes += 1
                if not row["deleted"] and key != known.get(row["id"]):
                    losers.append(row)  # perhaps a concurrent version: ``history``
                continue
            check_width(wire, dim)
            values = batch[fresh - 1] if batch is not None else vector_from_wire(wire)
            if values is not None and redacted_text(wire, row):
                values = None  # embedded from the secret: re-embedded from the redacted text
        except ValidationError as exc:
            result.problems.append(RowProblem("node", index, safe_id(wire.id), exc.field, exc.message))
            continue
        known[row["id"]] = key
        winners[row["id"]] = (row, None if values is None else Vector(model, values))
        result.applied_nodes += 1
    writer.apply_nodes(list(winners.values()), model,
                       {mid for mid in winners if mid not in stored})
    history.keep_losers(writer, losers)
    for index, ewire in enumerate(edges):
        try:
            erow = edge_from_wire(ewire)
        except ValidationError as exc:
            result.problems.append(RowProblem("edge", index, safe_id(ewire.id), exc.field, exc.message))
            continue
        versions.append(erow["updated_at"])
        if writer.apply_edge(erow):
            result.applied_edges += 1
        else:
            result.skipped_edges += 1
    _note_versions(result, versions)
    _receive_versions(writer, result)
    return result


def vectors_from_wires(wires: list[NodeRow]) -> list[npt.NDArray[np.float32] | None] | None:
    """``vector_from_wire`` for a whole page in one pack and one check — or None when any
    embedding is malformed or the widths differ (the caller then goes row by row, so each bad
    row is reported on its own)."""
    present = [i for i, w in enumerate(wires) if w.embedding is not None and not w.deleted]
    out: list[npt.NDArray[np.float32] | None] = [None] * len(wires)
    if not present:
        return out
    dims = {len(wires[i].embedding or ()) for i in present}
    if len(dims) != 1:
        return None
    dim = dims.pop()
    if dim == 0:
        return None
    lists = [wires[i].embedding or [] for i in present]
    matrix = float32_rows(lists, dim)
    if matrix is None:  # not all floats, or not all finite: struct says which, row by row
        return None
    nonzero: npt.NDArray[np.bool_] = np.asarray(matrix.any(axis=1))
    for row, i in enumerate(present):
        if nonzero[row]:
            out[i] = matrix[row]
    return out


def _note_versions(result: ApplyResult, versions: list[str]) -> None:
    """The batch's largest version, and which versions lie beyond the drift bound (rare: a
    writer whose clock runs ahead) — one ``max`` over the list on the common path."""
    if not versions:
        return
    top = max(versions)
    result.max_version = top
    if top <= result.bound:
        result.max_within = top
        return
    result.beyond_drift = [v for v in versions if v > result.bound]
    result.max_within = max((v for v in versions if v <= result.bound), default=None)


def _receive_versions(writer: Writer, result: ApplyResult) -> None:
    """The HLC receive rule for the whole batch: receiving the largest stamp within the drift
    bound is the same as receiving each in turn; stamps beyond it are counted, not received."""
    if result.max_within is not None:
        writer.clock.receive(result.max_within)
    for version in result.beyond_drift:
        writer.clock.receive(version)

