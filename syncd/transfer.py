"""``syncd export`` and ``syncd import``: the plane's JSON export as a file, through the
running daemon.

Rules:
  * An export written with ``-o`` replaces the file whole or not at all.
  * Neither holds a whole file in memory: an export is copied as it arrives, an import read a
    piece at a time (``syncd/jsonrows.py``).
  * An import goes in batches of ``IMPORT_BATCH_ROWS``; every refused row is reported by its
    place in the file — whether it was refused here (ill-typed for the wire: not sent, since
    the daemon would refuse its whole batch) or by the daemon (which numbers a batch's rows).
"""

from __future__ import annotations

import argparse
import os
import shutil
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
from syncd.jsonrows import count_rows, rows

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
    """Send the file's rows in batches, reading it a piece at a time (``syncd/jsonrows.py``):
    once through to check it is an export and count its rows (nothing is sent from a file
    that is not), then again to send them. ``-`` reads standard input, first copied to a
    private temporary file (read twice, as a file is). Every refused row is reported by its
    place in the file, whether this command found it ill-typed (it is then not sent: the daemon
    would refuse its whole batch) or the daemon refused it."""
    name = "standard input" if str(args.file) == "-" else str(args.file)
    try:
        with _readable(args.file) as path:
            with path.open(encoding="utf-8-sig") as handle:  # a BOM is not data
                total = sum(count_rows(handle).values())
            batches = _Batches(client, total)
            with path.open(encoding="utf-8-sig") as handle:  # a BOM is not data
                for key, index, row in rows(handle):
                    batches.add(key, index, row)
    except OSError as exc:
        print(f"syncd: cannot read {name}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    except ValueError as exc:  # not an export (or not UTF-8), or changed while being read
        print(f"syncd: {name}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    batches.send()
    applied, refused = batches.applied, batches.refused
    unchanged = total - applied[0] - applied[1] - len(refused)
    print(f"applied {applied[0]} memories and {applied[1]} edges; {unchanged} rows unchanged "
          f"(this store already holds that version or a newer one); {len(refused)} rows refused")
    for error in refused[:20]:
        print(f"  {error}", file=sys.stderr)
    if len(refused) > 20:
        print(f"  … and {len(refused) - 20} more", file=sys.stderr)
    return EXIT_OK if not refused else EXIT_FAILED


@contextmanager
def _readable(source: Path) -> Iterator[Path]:
    """``source``, or for ``-`` standard input copied whole into a temporary file (0600,
    removed on leaving): an import reads its input twice."""
    if str(source) != "-":
        yield source
        return
    with tempfile.NamedTemporaryFile(prefix="syncd-import-", suffix=".json") as spool:
        shutil.copyfileobj(sys.stdin.buffer, spool, 1 << 20)
        spool.flush()
        yield Path(spool.name)


class _Batches:
    """Rows on their way to the daemon: well-typed ones go in batches of
    ``IMPORT_BATCH_ROWS`` (nodes and edges together), ill-typed ones straight to ``refused``."""

    def __init__(self, client: Client, total: int) -> None:
        self.client, self.total = client, total
        self.parts: dict[str, list[tuple[int, object]]] = {"node": [], "edge": []}
        self.applied, self.refused, self.read = [0, 0], list[str](), 0

    def add(self, key: str, index: int, row: object) -> None:
        self.read += 1
        kind = "node" if key == "memory_nodes" else "edge"
        try:
            msgspec.convert(row, NodeRow if kind == "node" else EdgeRow)
        except msgspec.ValidationError as exc:
            self.refused.append(f"{key}[{index}]: {exc}")
            return
        self.parts[kind].append((index, row))
        if len(self.parts[kind]) >= IMPORT_BATCH_ROWS:
            self.send()

    def send(self) -> None:
        parts, self.parts = self.parts, {"node": [], "edge": []}
        if not parts["node"] and not parts["edge"]:
            return
        result = self.client.call("POST", "/v1/agent/memory/import", {
            "memory_nodes": [row for _, row in parts["node"]],
            "memory_edges": [row for _, row in parts["edge"]]})
        self.applied[0] += result["applied_nodes"]
        self.applied[1] += result["applied_edges"]
        first = min(index for part in parts.values() for index, _ in part[:1])
        self.refused += [_refusal(e, parts[e["kind"]]) for e in result.get("row_errors") or ()] or [
            f"a batch from row {first}: {e}" for e in result["errors"]]  # no row_errors
        print(f"processed {self.read} / {self.total} rows", file=sys.stderr)


def _refusal(error: dict[str, Any], part: list[tuple[int, object]]) -> str:
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
