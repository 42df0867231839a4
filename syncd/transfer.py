"""``syncd export`` and ``syncd import``: the plane's JSON export as a file, through the
running daemon.

Rules:
  * An export written with ``-o`` replaces the file whole or not at all.
  * An import goes in batches of ``IMPORT_BATCH_ROWS``; every refused row is reported by its
    place in the file — whether it was refused here (ill-typed for the wire: not sent, since
    the daemon would refuse its whole batch) or by the daemon (which numbers a batch's rows).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import msgspec

from protocol.rows import EXPORT_COUNT_HEADERS, EdgeRow, NodeRow
from syncd.client import Client
from syncd.exits import EXIT_FAILED, EXIT_OK

IMPORT_BATCH_ROWS = 500


def export_file(client: Client, args: argparse.Namespace) -> int:
    """The daemon's export, copied to the file (or stdout) as it arrives: the whole body never
    sits in memory. The file is replaced only by a complete export."""
    path = "/v1/agent/memory/export" + (f"?realm={quote(args.realm)}"
                                        if args.realm is not None else "")
    if not args.output:
        client.download(path, sys.stdout.buffer)
        sys.stdout.buffer.write(b"\n")
        return EXIT_OK
    try:
        with _replacing(args.output) as handle:
            headers = client.download(path, handle)
    except OSError as exc:
        print(f"syncd: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    memories, edges = (headers.get(name, "?") for name in EXPORT_COUNT_HEADERS)
    print(f"exported {memories} memories and {edges} edges to {args.output}", file=sys.stderr)
    return EXIT_OK


def import_file(client: Client, args: argparse.Namespace) -> int:
    """Send the file's rows in batches. Every refused row is reported by its place in the file,
    whether this command found it ill-typed (it is then not sent: the daemon would refuse its
    whole batch) or the daemon refused it."""
    try:
        data = json.loads(args.file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"syncd: cannot read {args.file}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if not isinstance(data, dict):
        print(f"syncd: {args.file}: expected an object with memory_nodes and memory_edges",
              file=sys.stderr)
        return EXIT_FAILED
    refused: list[str] = []
    try:
        nodes = _well_typed(data, "memory_nodes", refused)
        edges = _well_typed(data, "memory_edges", refused)
    except ValueError as exc:
        print(f"syncd: {args.file}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    total = len(nodes) + len(edges) + len(refused)
    applied, done = [0, 0], len(refused)
    for start in range(0, max(len(nodes), len(edges), 1), IMPORT_BATCH_ROWS):
        parts = {"node": nodes[start:start + IMPORT_BATCH_ROWS],
                 "edge": edges[start:start + IMPORT_BATCH_ROWS]}
        result = client.call("POST", "/v1/agent/memory/import", {
            "memory_nodes": [row for _, row in parts["node"]],
            "memory_edges": [row for _, row in parts["edge"]]})
        applied[0] += result["applied_nodes"]
        applied[1] += result["applied_edges"]
        refused += [_refusal(e, parts[e["kind"]]) for e in result.get("row_errors") or ()] or [
            f"a batch from row {start}: {e}" for e in result["errors"]]  # no row_errors
        done += len(parts["node"]) + len(parts["edge"])
        print(f"processed {done} / {total} rows", file=sys.stderr)
    unchanged = total - applied[0] - applied[1] - len(refused)
    print(f"applied {applied[0]} memories and {applied[1]} edges; {unchanged} rows unchanged "
          f"(this store already holds that version or a newer one); {len(refused)} rows refused")
    for error in refused[:20]:
        print(f"  {error}", file=sys.stderr)
    if len(refused) > 20:
        print(f"  … and {len(refused) - 20} more", file=sys.stderr)
    return EXIT_OK if not refused else EXIT_FAILED


def _well_typed(data: dict[str, Any], key: str,
                refused: list[str]) -> list[tuple[int, dict[str, Any]]]:
    """``data[key]``'s rows with their place in the file; a row of the wrong shape for the
    wire (not an object, an id that is a number…) goes to ``refused`` instead."""
    rows = data.get(key)
    if rows is None:
        return []
    if not isinstance(rows, list):
        raise ValueError(f"{key} must be a list of rows, got {type(rows).__name__}")
    row_type = NodeRow if key == "memory_nodes" else EdgeRow
    out = []
    for index, row in enumerate(rows):
        try:
            msgspec.convert(row, row_type)
        except msgspec.ValidationError as exc:
            refused.append(f"{key}[{index}]: {exc}")
            continue
        out.append((index, row))
    return out


def _refusal(error: dict[str, Any], part: list[tuple[int, dict[str, Any]]]) -> str:
    """A row the daemon refused, numbered as in the file (the daemon numbers a batch's rows)."""
    where = f"memory_{error['kind']}s[{part[error['index']][0]}]"
    if error.get("id"):
        where += f" ({error['id']})"
    return f"{where}.{error.get('field') or 'row'}: {error['message']}"


@contextmanager
def _replacing(path: Path) -> Iterator[IO[bytes]]:
    """A file to write ``path``'s new content into: ``path`` then holds all of it or what it
    held before, never a part (a full disk, a crash, an error while writing). A new file is
    0600 (it holds memories); a replaced one keeps its mode."""
    fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
        if path.exists():
            os.chmod(partial, path.stat().st_mode & 0o7777)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
