"""A stand-in for ``python -m local_store.embed_worker`` in tests of ``WorkerEmbedder``: the same
frames on stdin and stdout (one request at a time, answered in order), behaviour chosen by what
the directory given as argv[1] holds.

  * ``die-once``: the file is removed and the process exits with status 3 on the next request
    (read, never answered): a child lost mid-request, once.
  * ``fail``: every request is answered with an ``EmbedderUnavailable`` failure frame.
  * ``received`` and ``release``, FIFOs: after reading a request the fake writes a line into
    ``received`` (the test's read of it returns: the request is in the child) and answers only
    once the test has written a line into ``release``.
  * ``gather``, holding a number N: the fake reads N requests before it answers any, then
    answers them last first (or, with ``die-once``, exits without answering them).
  * otherwise: each text's row is 1 in the column of its length, mod 384.

It exits at end-of-file on stdin, as the real child does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from local_store.embed_worker import _FAILED, _ID, _OK, _read_frame, _write_frame


def answer(where: Path, ident: bytes, request: bytes) -> None:
    if (where / "fail").exists():
        failure = {"type": "EmbedderUnavailable", "message": "model.onnx is missing here"}
        _write_frame(sys.stdout.buffer, ident + _FAILED + json.dumps(failure).encode())
        return
    texts = json.loads(request).get("texts", [])
    rows = np.zeros((len(texts), 384), dtype="<f4")
    for row, text in enumerate(texts):
        rows[row, len(text) % 384] = 1.0
    _write_frame(sys.stdout.buffer, ident + _OK + rows.tobytes())


def main() -> None:
    where = Path(sys.argv[1])
    gather = int((where / "gather").read_text()) if (where / "gather").exists() else 1
    while (frame := _read_frame(sys.stdin.buffer)) is not None:
        frames = [frame]
        while len(frames) < gather and (frame := _read_frame(sys.stdin.buffer)) is not None:
            frames.append(frame)
        if (where / "received").exists():
            with open(where / "received", "w") as received:
                received.write("got it\n")
            with open(where / "release") as release:
                release.readline()
        if (where / "die-once").exists():
            (where / "die-once").unlink()
            sys.exit(3)
        for got in reversed(frames):
            answer(where, got[:_ID.size], got[_ID.size:])


if __name__ == "__main__":
    main()
