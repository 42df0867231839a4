"""``syncd export`` and ``syncd import``: the plane's JSON export as a file, through the
running daemon.

Rules:
  * An export written with ``-o`` replaces the file whole or not at all.
  * Neither holds a whole file in memory: an export is copied as it arrives, an import read a
    piece at a time (``syncd/jsonrows.py``).
  * An import goes in batches of at most ``IMPORT_BATCH_ROWS`` rows and of a body safely under
    the daemon's limit (``daemon.max_body_bytes``, less ``1 / IMPORT_BODY_MARGIN``): a batch
    over it is refused whole (413), so a batch is sent early rather than grow past it, and one
    the daemon still refuses as too large is split in two until a row alone is refused.
  * Every refused row is reported by its place in the file — whether it was refused here (not
    sent, since the daemon would refuse its whole batch: ill-typed for the wire, a number JSON
    cannot carry such as ``1e999``, a lone surrogate, too large for any request) or by the
    daemon (which numbers a batch's rows).
  * An import that stops part way (the daemon went away, an error answer) still says what it
    applied before the error does: applying the same file again is harmless.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, NamedTuple
from urllib.parse import urlencode

import msgspec

from local_store.redact import holds_lone_surrogate, strip_private
from protocol.rows import EXPORT_COUNT_HEADERS, EdgeRow, NodeRow
from syncd.client import Client, ClientError
from syncd.config import DEFAULT_MAX_BODY_BYTES
from syncd.exits import EXIT_FAILED, EXIT_OK
from syncd.export_markdown import MARKDOWN_FIRST_LINE
from syncd.jsonrows import count_rows, rows

IMPORT_BATCH_ROWS = 500
IMPORT_BODY_MARGIN = 16  # a batch's body stays under max_body_bytes less a sixteenth
# '{"memory_nodes": [' … '], "memory_edges": [' … ']}' around the rows, rounded up
_BODY_FRAME_BYTES = 64


EXPORT_MEDIA_TYPES = {"json": "application/json", "markdown": "text/markdown"}


def export_file(client: Client, args: argparse.Namespace) -> int:
    """The daemon's export, copied to the file (or stdout) as it arrives: the whole body never
    sits in memory. The file is replaced only by a complete export."""
    form = getattr(args, "format", "json")  # the CLI's --format; json when not given
    query = [("format", form)] if form != "json" else []
    query += [("realm", args.realm)] if args.realm is not None else []
    path = "/v1/agent/memory/export" + (f"?{urlencode(query)}" if query else "")
    expect = EXPORT_MEDIA_TYPES[form]
    if not args.output:
        client.download(path, sys.stdout.buffer, expect)
        if form == "json":  # Markdown ends with its own line break
            sys.stdout.buffer.write(b"\n")
        return EXIT_OK
    try:
        with _replacing(args.output) as handle:
            headers = client.download(path, handle, expect)
    except OSError as exc:
        print(f"syncd: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    memories, edges = (headers.get(name, "?") for name in EXPORT_COUNT_HEADERS)
    print(f"exported {memories} memories and {edges} edges to {args.output}", file=sys.stderr)
    return EXIT_OK


def import_file(client: Client, args: argparse.Namespace,
                max_body: int = DEFAULT_MAX_BODY_BYTES) -> int:
    """Send the file's rows in batches, reading it a piece at a time (``syncd/jsonrows.py``):
    once through to check it is an export — an object with ``memory_nodes`` or
    ``memory_edges``, though the daemon's route takes ``{}`` — and count its rows (nothing is
    sent from a file that is not), then again to send them. ``-`` reads standard input, first
    copied to a private temporary file (read twice, as a file is). Every refused row is reported by its
    place in the file, whether this command refused it (it is then not sent: the daemon would
    refuse its whole batch) or the daemon did. ``max_body`` is the daemon's request body limit
    (``daemon.max_body_bytes``). A ``ClientError`` part way is raised after what was applied
    is printed."""
    name = "standard input" if str(args.file) == "-" else str(args.file)
    batches: _Batches | None = None
    try:
        with _readable(args.file) as path:
            with path.open(encoding="utf-8-sig") as handle:  # a BOM is not data
                if handle.readline().rstrip("\r\n") == MARKDOWN_FIRST_LINE:
                    raise ValueError("this is a Markdown export, for reading; `syncd import` "
                                     "takes the JSON export (`syncd export`, --format json)")
                handle.seek(0)
                total = sum(count_rows(handle, require_an_array=True).values())
            batches = _Batches(client, total, max_body)
            with path.open(encoding="utf-8-sig") as handle:  # a BOM is not data
                for key, index, row in rows(handle):
                    batches.add(key, index, row)
        batches.send()
    except OSError as exc:
        _stopped(batches)
        print(f"syncd: cannot read {name}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    except ValueError as exc:  # not an export (or not UTF-8), or changed while being read
        _stopped(batches)
        print(f"syncd: {name}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except ClientError:  # the caller reports it, after what was done
        _stopped(batches)
        raise
    applied, refused = batches.applied, batches.refused
    unchanged = total - applied[0] - applied[1] - len(refused)
    if getattr(args, "json", False):
        print(json.dumps({"applied": {"memories": applied[0], "edges": applied[1]},
                          "unchanged": unchanged, "refused": refused}))
        return EXIT_OK if not refused else EXIT_FAILED
    print(f"applied {applied[0]} memories and {applied[1]} edges; {unchanged} rows unchanged "
          f"(this store already holds that version or a newer one); {len(refused)} rows refused")
    _list_refused(refused)
    return EXIT_OK if not refused else EXIT_FAILED


def _stopped(batches: _Batches | None) -> None:
    """What an import that stopped part way had done, once it had sent anything."""
    if batches is None or not batches.posted:
        return
    applied, refused = batches.applied, batches.refused
    print(f"applied {applied[0]} memories and {applied[1]} edges before the import stopped "
          f"({batches.done} of {batches.total} rows done); {len(refused)} rows refused; "
          "importing the file again is safe (rows already applied are left unchanged)")
    _list_refused(refused)


def _list_refused(refused: list[str]) -> None:
    for error in refused[:20]:
        print(f"  {error}", file=sys.stderr)
    if len(refused) > 20:
        print(f"  … and {len(refused) - 20} more", file=sys.stderr)


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


class _Row(NamedTuple):
    kind: str  # "node" or "edge"
    place: int  # its index in the file's array
    row: object


class _Batches:
    """Rows on their way to the daemon: well-typed ones go in batches (nodes and edges
    together) of at most ``IMPORT_BATCH_ROWS`` rows and ``budget`` bytes of body; the others
    straight to ``refused``."""

    def __init__(self, client: Client, total: int, max_body: int) -> None:
        self.client, self.total = client, total
        self.budget = max_body - max_body // IMPORT_BODY_MARGIN
        self.batch: list[_Row] = []
        self.bytes = _BODY_FRAME_BYTES
        self.applied, self.refused, self.read = [0, 0], list[str](), 0
        self.done, self.posted = 0, False  # rows sent and answered (or refused here)

    def add(self, key: str, index: int, row: object) -> None:
        self.read += 1
        kind = "node" if key == "memory_nodes" else "edge"
        refusal = _refused_here(row, kind)
        try:
            encoded = json.dumps(row, allow_nan=False)  # as Client.call sends it
        except ValueError:  # 1e999 in the file is float("inf") here, NaN float("nan")
            refusal = refusal or ("holds a number JSON cannot carry (NaN, or one out of range "
                                  "such as 1e999): not sent")
            encoded = ""
        if refusal is None and _SURROGATE_ESCAPE.search(encoded) and holds_lone_surrogate(row):
            refusal = ("holds a lone surrogate escape (\\ud800-\\udfff without its pair), "
                       "which is not text: not sent")
        size = len(encoded) + len(", ")  # its bytes in the body, with a separator
        if refusal is None and _BODY_FRAME_BYTES + size > self.budget:
            refusal = (f"{size} bytes as JSON, too large for any request to the daemon (at "
                       f"most {self.budget}: daemon.max_body_bytes less a margin): not sent")
        if refusal is not None:
            self.refused.append(f"{key}[{index}]{_label(row)}: {refusal}")
            self.done += 1
            return
        if self.bytes + size > self.budget:
            self.send()
        self.batch.append(_Row(kind, index, row))
        self.bytes += size
        if len(self.batch) >= IMPORT_BATCH_ROWS:
            self.send()

    def send(self) -> None:
        batch, self.batch, self.bytes = self.batch, [], _BODY_FRAME_BYTES
        if batch:
            self._post(batch)
            print(f"processed {self.read} / {self.total} rows", file=sys.stderr)

    def _post(self, batch: list[_Row]) -> None:
        """Send ``batch``; one the daemon refuses as too large (its limit is below the one
        this command was told) goes again in two halves, until a row alone is refused."""
        self.posted = True
        nodes = [entry for entry in batch if entry.kind == "node"]
        edges = [entry for entry in batch if entry.kind == "edge"]
        try:
            result = self.client.call("POST", "/v1/agent/memory/import", {
                "memory_nodes": [entry.row for entry in nodes],
                "memory_edges": [entry.row for entry in edges]})
        except ClientError as exc:
            if exc.status != 413:
                raise
            if len(batch) > 1:
                self._post(batch[:len(batch) // 2])
                self._post(batch[len(batch) // 2:])
                return
            entry = batch[0]
            self.refused.append(f"memory_{entry.kind}s[{entry.place}]{_label(entry.row)}: "
                                f"refused by the daemon as too large ({exc})")
            self.done += 1
            return
        self.applied[0] += result["applied_nodes"]
        self.applied[1] += result["applied_edges"]
        self.done += len(batch)
        parts = {"node": nodes, "edge": edges}
        first = min(entry.place for entry in batch)
        self.refused += [_refusal(e, parts[e["kind"]]) for e in result.get("row_errors") or ()] or [
            f"a batch from row {first}: {e}" for e in result["errors"]]  # no row_errors


def _refused_here(row: object, kind: str) -> str | None:
    """Why the daemon would refuse ``row`` (and with it its whole batch), or None."""
    try:
        msgspec.convert(row, NodeRow if kind == "node" else EdgeRow)
    except msgspec.ValidationError as exc:
        return str(exc)
    return None


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # in json.dumps's ASCII output


def _label(row: object) -> str:
    """`` (its id)`` for a row that has a string id, else nothing."""
    row_id = row.get("id") if isinstance(row, dict) else None
    return f" ({strip_private(row_id)})" if isinstance(row_id, str) and row_id else ""


def _refusal(error: dict[str, Any], part: list[_Row]) -> str:
    """A row the daemon refused, numbered as in the file (the daemon numbers a batch's rows)."""
    where = f"memory_{error['kind']}s[{part[error['index']].place}]"
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
