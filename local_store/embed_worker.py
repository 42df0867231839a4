"""all-MiniLM-L6-v2 in a child process, so that an idle unload gives back all it took (issue 36).

Unloading the model inside the daemon left ~60 MB behind: onnxruntime's and tokenizers' code
pages and the heap their imports grew stay mapped in a process once it has imported them.
``WorkerEmbedder`` keeps all of that in a child process; stopping the child returns it.

Rules:
  * The daemon never imports onnxruntime or tokenizers. The first embed (or ``load``) starts
    ``python -m local_store.embed_worker``, which runs the in-process ``MiniLMEmbedder``: the
    vectors are the same bits. ``unload_if_idle`` stops the child once no embed has run for
    ``idle_unload_secs`` and none is in flight; the next embed starts another.
  * Several threads may have a request in flight: each carries an id and its answer carries it
    back (the child runs one-text requests in order and a batch beside them: ``serve``). A
    frame is a 4-byte little-endian length, then a 4-byte id and the bytes. A request is
    JSON: ``{"texts": [...]}`` or ``{"load": true}``. An answer is ``b"\\0"`` and the rows as
    little-endian float32, or ``b"\\1"`` and JSON ``{"type": ..., "message": ...}`` for what the
    embedder raised there.
  * In the parent, whichever waiting thread finds no reader reads answers (handing over the
    ones for others) until its own comes: a lone request is read by the thread that asked, with
    no hand-over between threads.
  * The child lives no longer than its parent: it exits when it reads end-of-file on stdin, which
    it does however the parent ends (a stop closes the pipe; a crash or SIGKILL closes it too).
    It ignores SIGINT and SIGTERM: a Ctrl-C in the daemon's terminal, or systemd's stop, which
    signals every process of the unit, stops the daemon, which drains its requests with this
    process still answering, then stops it (SIGKILL still ends it).
  * An embed that finds the child gone starts another; the requests in flight when it dies fail
    with ``EmbedderUnavailable`` naming its exit status (the store saves such a memory without
    a vector and owes it one, as for any embedder failure).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import math
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import numpy as np

from local_store.embed import Vectors
from local_store.embed_minilm import (
    MINILM_DIM,
    MINILM_MODEL_ID,
    EmbedderUnavailable,
    MiniLMEmbedder,
    check_settings,
)

log = logging.getLogger("local_store.embed_worker")

_LENGTH = struct.Struct("<I")
_ID = struct.Struct("<I")
_OK, _FAILED = b"\0", b"\1"
STOP_WAIT_SECS = 10.0  # a child that has not exited this long after its stdin closed is killed
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


class ChildFailed(RuntimeError):
    """The child raised something other than ``EmbedderUnavailable``; its type and message."""


def child_command(intra_op_threads: int | None, cache_dir: Path | None) -> list[str]:
    command = [sys.executable, "-m", "local_store.embed_worker"]
    if intra_op_threads is not None:
        command += ["--threads", str(intra_op_threads)]
    if cache_dir is not None:
        command += ["--cache-dir", str(cache_dir)]
    return command


class WorkerEmbedder:
    """The ``MiniLMEmbedder`` interface the daemon uses, served by a child process.

    ``command``: what starts the child (``child_command`` by default; a test gives a small fake).
    ``clock`` measures idleness for ``unload_if_idle``, as ``MiniLMEmbedder``'s does.
    """

    def __init__(self, intra_op_threads: int | None = None, *, idle_unload_secs: float = 0.0,
                 cache_dir: Path | None = None, command: Sequence[str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        check_settings(intra_op_threads, idle_unload_secs)
        self._command = list(command or child_command(intra_op_threads, cache_dir))
        self._idle_unload_secs = idle_unload_secs
        self._clock = clock
        self._starting = threading.Lock()  # one start at a time (never held during a request)
        self._state = threading.Lock()  # guards the fields below (never held while waiting)
        self._child: _Child | None = None
        self._in_flight = 0
        self._last_used = 0.0
        self._load_count = 0
        self.unload_count = 0

    @property
    def model_id(self) -> str:
        return MINILM_MODEL_ID

    @property
    def dim(self) -> int:
        return MINILM_DIM

    @property
    def loaded(self) -> bool:
        child = self._child
        return child is not None and child.popen.poll() is None

    @property
    def load_count(self) -> int:
        """Children started so far."""
        return self._load_count

    @property
    def idle_unload_secs(self) -> float:
        return self._idle_unload_secs

    @property
    def pid(self) -> int | None:
        child = self._child
        return None if child is None else child.popen.pid

    def load(self) -> None:
        """Start the child and have it load the model now (``EmbedderUnavailable`` if it cannot)."""
        self._ask(json.dumps({"load": True}).encode(), rows=0)

    def embed(self, texts: list[str]) -> Vectors:
        if not any(text.strip() for text in texts):  # zero rows: no child for nothing to embed
            return np.zeros((len(texts), MINILM_DIM), dtype=np.float32)
        return self._ask(json.dumps({"texts": texts}).encode(), rows=len(texts))

    def unload_if_idle(self) -> float:
        """Stop the child when no embed has run for ``idle_unload_secs`` and none is in flight;
        the seconds after which to ask again (``inf`` when it never unloads)."""
        idle = self._idle_unload_secs
        if idle <= 0:
            return math.inf
        with self._state:
            if self._child is None or self._in_flight:
                return idle  # an embed in flight marks a fresh use when it ends
            due = self._last_used + idle - self._clock()
            if due > 0:
                return due
            child, self._child = self._child, None
            self.unload_count += 1
        child.stop()
        log.info("unloaded %s after %g s unused; the next embed loads it again",
                 MINILM_MODEL_ID, idle)
        return idle

    def close(self) -> None:
        """Stop the child, if one runs (the daemon's last step; an embed after it starts one)."""
        with self._state:
            child, self._child = self._child, None
        if child is not None:
            child.stop()

    def _ask(self, request: bytes, rows: int) -> Vectors:
        with self._state:
            self._in_flight += 1
        try:
            answer = self._running().ask(request)
        finally:
            with self._state:
                self._in_flight -= 1
                self._last_used = self._clock()
        return _decode(answer, rows)

    def _running(self) -> _Child:
        """The child, started when there is none or the last one died."""
        with self._starting:
            with self._state:
                child = self._child
            if child is not None and child.popen.poll() is None:
                return child
            if child is not None:
                log.warning("the %s process exited (%s); starting another", MINILM_MODEL_ID,
                            _status(child.popen))
                child.stop()  # its pipes
            try:
                popen = subprocess.Popen(self._command, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, env=_child_env(),
                                         close_fds=True)
            except OSError as exc:
                raise EmbedderUnavailable(f"{MINILM_MODEL_ID}: cannot start its process "
                                          f"{self._command[0]}: {exc.strerror or exc}") from None
            child = _Child(popen)
            with self._state:
                self._child = child
                self._load_count += 1
            return child


class _Child:
    """One child process and the requests in flight to it.

    Its stdin is written under ``_sending`` and closed under it (never written after). Its
    stdout is read only by the thread that holds the reader's turn, and closed only by that
    thread or, when none holds it, by ``stop`` (after which no thread takes the turn): a
    closed descriptor number, which the next ``open`` may reuse, is never read or written.
    """

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stdin is not None and popen.stdout is not None
        self.popen = popen
        self._stdout = popen.stdout.fileno()
        self._ids = itertools.count()
        self._sending = threading.Lock()  # guards stdin and _stdin_closed
        self._stdin_closed = False
        self._turn = threading.Lock()  # guards the three fields below and every _Waiter
        self._waiting: dict[int, _Waiter] = {}
        self._reading = False
        self._lost: str | None = None

    def ask(self, request: bytes) -> bytes:
        ident = next(self._ids) & 0xFFFFFFFF
        waiter = _Waiter()
        with self._turn:
            self._waiting[ident] = waiter
        with self._sending:
            if not self._stdin_closed:
                assert self.popen.stdin is not None
                with contextlib.suppress(OSError):  # gone: the read below finds out
                    _write_frame(self.popen.stdin.fileno(), _ID.pack(ident) + request)
        return self._wait(ident, waiter)

    def stop(self) -> None:
        """Close its stdin (it exits at end-of-file) and reap it; kill it if it lingers."""
        self._close_stdin()
        _reap(self.popen)
        with self._turn:
            if not self._reading and self._lost is None:  # a reader closes it itself
                self._close_stdout()
                self._lose(f"{MINILM_MODEL_ID}: its process was stopped")

    def _wait(self, ident: int, waiter: _Waiter) -> bytes:
        """The answer to ``ident``: handed over by the reader, or read here as the reader."""
        while True:
            with self._turn:
                if waiter.answer is not None:
                    return waiter.answer
                if self._lost is not None:
                    raise EmbedderUnavailable(self._lost)
                if not self._reading:
                    self._reading = True
                    break
                waiter.woken.clear()  # set again only under _turn, after this
            waiter.woken.wait()
        while (frame := _read_frame(self._stdout)) is not None and len(frame) >= _ID.size:
            (got,) = _ID.unpack_from(frame)
            with self._turn:
                other = self._waiting.pop(got, None)
                if got == ident:
                    self._reading = False
                    for nxt in self._waiting.values():  # one waiter reads from here on
                        nxt.woken.set()
                        break
                    return frame[_ID.size:]
                if other is not None:
                    other.answer = frame[_ID.size:]
                    other.woken.set()
        # Its stdout ended (or made no sense): it is exiting, or is made to. Still the reader:
        # nobody else reads.
        self._close_stdin()
        _reap(self.popen)
        self._close_stdout()
        lost = (f"{MINILM_MODEL_ID}: its process exited during an embed "
                f"({_status(self.popen)}); the next embed starts another")
        with self._turn:
            self._reading = False
            self._lose(lost)
        raise EmbedderUnavailable(lost)

    def _lose(self, why: str) -> None:
        """(Under ``_turn``.) Every request still waiting fails with ``why``."""
        self._lost = why
        for waiter in self._waiting.values():
            waiter.woken.set()
        self._waiting.clear()

    def _close_stdin(self) -> None:
        with self._sending:
            if not self._stdin_closed:
                self._stdin_closed = True
                assert self.popen.stdin is not None
                with contextlib.suppress(OSError):  # a pipe the dead child left broken
                    self.popen.stdin.close()

    def _close_stdout(self) -> None:
        assert self.popen.stdout is not None
        self.popen.stdout.close()


class _Waiter:
    """A request's answer, once the reader has handed it over, and the event that wakes it."""

    __slots__ = ("answer", "woken")

    def __init__(self) -> None:
        self.answer: bytes | None = None
        self.woken = threading.Event()


def _child_env() -> dict[str, str]:
    """The parent's environment, with this package importable however the parent found it,
    and glibc's malloc kept to one arena: a batch on the child's second thread otherwise left
    21 MB in that thread's arena, which ``malloc_trim`` did not hand back (bench/memory.py)."""
    env = dict(os.environ)
    env.setdefault("MALLOC_ARENA_MAX", "1")
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = _PACKAGE_ROOT if not path else _PACKAGE_ROOT + os.pathsep + path
    return env


def _decode(answer: bytes, rows: int) -> Vectors:
    head, body = answer[:1], answer[1:]
    if head == _FAILED:
        failure = json.loads(body)
        if failure.get("type") == EmbedderUnavailable.__name__:
            raise EmbedderUnavailable(failure["message"])
        raise ChildFailed(f"{failure.get('type')}: {failure.get('message')}")
    if head != _OK or len(body) != rows * MINILM_DIM * 4:
        raise ChildFailed(f"the {MINILM_MODEL_ID} process answered {len(answer)} bytes for "
                          f"{rows} rows")
    matrix: Vectors = np.frombuffer(body, dtype="<f4").reshape(rows, MINILM_DIM).copy()
    return matrix


def _read_frame(source: IO[bytes] | int) -> bytes | None:
    """One frame's bytes from a stream or a file descriptor; None at end-of-file (also in the
    middle of one)."""
    head = _read_exactly(source, _LENGTH.size)
    if head is None:
        return None
    (length,) = _LENGTH.unpack(head)
    return _read_exactly(source, length)


def _read_exactly(source: IO[bytes] | int, size: int) -> bytes | None:
    read = functools.partial(os.read, source) if isinstance(source, int) else source.read
    parts, left = [], size
    while left:
        part = read(left)
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _write_frame(target: IO[bytes] | int, body: bytes) -> None:
    """One frame to a stream (flushed) or a file descriptor (no buffer between it and the
    pipe)."""
    frame = _LENGTH.pack(len(body)) + body
    if isinstance(target, int):
        view = memoryview(frame)
        while view:
            view = view[os.write(target, view):]
    else:
        target.write(frame)
        target.flush()


def _status(child: subprocess.Popen[bytes]) -> str:
    code = child.poll()
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by signal {-code}"
    return f"exit status {code}"


def _reap(child: subprocess.Popen[bytes]) -> None:
    try:
        child.wait(STOP_WAIT_SECS)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def serve(embedder: Any, requests: IO[bytes], answers: IO[bytes]) -> None:
    """The child's loop: frames in, each answered, until end-of-file (then what still runs is
    answered before it returns).

    A request of one text (a save, a query) runs here, on the reading thread, in order. One of
    several texts (a batch save, a re-embedding pass) runs on a second thread, one batch at a
    time, so the queries that come meanwhile are not held behind it, as they were not in the
    daemon's own process. Every request on the pool's threads instead cost a lone query ×1.18
    the in-process time (against ×1.09–1.13) and held 21 MB more after 1,000 saves
    (bench/memory.py)."""
    writing = threading.Lock()

    def reply(ident: int, asked: Any) -> None:
        body = _handle(embedder, asked)
        with writing:
            _write_frame(answers, _ID.pack(ident) + body)

    with ThreadPoolExecutor(1, thread_name_prefix="embed-batch") as batches:  # started lazily
        while (frame := _read_frame(requests)) is not None:
            (ident,) = _ID.unpack_from(frame)
            asked = _parse(frame[_ID.size:])
            if isinstance(asked, dict) and len(asked.get("texts") or ()) > 1:
                batches.submit(reply, ident, asked)
            else:
                reply(ident, asked)


def _parse(request: bytes) -> Any:
    try:
        return json.loads(request)
    except ValueError as exc:
        return exc


def _handle(embedder: Any, asked: Any) -> bytes:
    try:
        if isinstance(asked, Exception):
            raise asked
        if asked.get("load"):
            embedder.load()
            return _OK
        return _OK + np.ascontiguousarray(embedder.embed(asked["texts"]), "<f4").tobytes()
    except Exception as exc:  # the parent raises it; the child keeps serving
        return _FAILED + json.dumps({"type": type(exc).__name__, "message": str(exc)}).encode()


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m local_store.embed_worker",
                                     description="all-MiniLM-L6-v2 for a syncd daemon, over "
                                     "length-prefixed frames on stdin and stdout")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    # A Ctrl-C in a terminal, or systemd's stop (SIGTERM to every process of the unit), is for
    # the parent: it drains its requests, with this process still answering, then stops it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"{MINILM_MODEL_ID} process: %(levelname)s %(message)s")
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever a library prints goes to the log, never into a frame
    embedder = MiniLMEmbedder(intra_op_threads=args.threads, cache_dir=args.cache_dir)
    serve(embedder, sys.stdin.buffer, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
