"""MiniLM in a child process (issue 36, ``local_store.embed_worker``): the child's vectors are the
in-process embedder's bit for bit; the idle unload stops the child (the process is gone) and the
next embed starts another; an embed in flight keeps it; a child lost mid-request fails that embed
and the next one starts a new child; the child exits when its parent is SIGKILLed. The real child
runs where the vectors or the exit matter; a small fake child (``fake_embed_child.py``) where a
test must hold a request in the child or lose the child on purpose."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from local_store import HashingEmbedder
from local_store.embed_minilm import EmbedderUnavailable, MiniLMEmbedder
from local_store.embed_worker import (
    _FAILED,
    _ID,
    _OK,
    ChildFailed,
    WorkerEmbedder,
    _read_frame,
    _write_frame,
    serve,
)

FAKE = Path(__file__).with_name("fake_embed_child.py")
TEXTS = ["how do I deploy", "", "release procedure: tag then make release",
         *(f"memory {i}: sqlite writer lock retry " * (1 + i % 7) for i in range(20))]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gone(pid: int) -> bool:
    """The process has exited: no such pid, or a zombie nobody has reaped yet."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def wait_until(condition, seconds: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    """Polls ``condition`` (a process's state has no event to wait on); the deadline only
    bounds a failing test."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def fake(where: Path, clock: Clock | None = None, idle: float = 0.0) -> WorkerEmbedder:
    return WorkerEmbedder(command=[sys.executable, str(FAKE), str(where)],
                          idle_unload_secs=idle, clock=clock or Clock())


def test_the_childs_vectors_are_the_in_process_embedders() -> None:
    worker = WorkerEmbedder()
    try:
        vectors = worker.embed(TEXTS)
        assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), 384)
        assert np.array_equal(vectors, MiniLMEmbedder().embed(TEXTS))
        assert not vectors[1].any()  # empty text: a zero row, as in process
        assert worker.loaded and worker.load_count == 1
        environ = Path(f"/proc/{worker.pid}/environ").read_bytes().split(b"\0")
        arenas = os.environ.get("MALLOC_ARENA_MAX", "1")  # one the parent was given stays
        assert f"MALLOC_ARENA_MAX={arenas}".encode() in environ  # no arena per thread
    finally:
        worker.close()
    assert not worker.loaded


def test_the_idle_unload_stops_the_child_and_the_next_embed_starts_another() -> None:
    clock = Clock()
    worker = WorkerEmbedder(idle_unload_secs=600, clock=clock)
    try:
        first = worker.embed(TEXTS[:3])
        pid = worker.pid
        assert pid is not None and not gone(pid)
        clock.now += 599
        assert worker.unload_if_idle() == pytest.approx(1.0)  # not yet: due in a second
        assert worker.loaded
        clock.now += 1
        assert worker.unload_if_idle() == 600
        assert not worker.loaded and worker.unload_count == 1
        assert gone(pid)  # reaped by the unload itself: its memory is the system's again
        assert np.array_equal(worker.embed(TEXTS[:3]), first)
        assert worker.load_count == 2 and worker.pid != pid
    finally:
        worker.close()


def test_only_empty_texts_start_no_child(tmp_path: Path) -> None:
    worker = fake(tmp_path)
    assert not worker.embed(["", "  "]).any()
    assert worker.load_count == 0 and not worker.loaded


def test_an_embed_in_flight_keeps_the_child(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "received")
    os.mkfifo(tmp_path / "release")
    clock = Clock()
    worker = fake(tmp_path, clock, idle=10)
    answers: list[np.ndarray] = []
    embedding = threading.Thread(target=lambda: answers.append(worker.embed(["abc"])))
    embedding.start()
    try:
        with open(tmp_path / "received") as received:  # returns once the child holds it
            assert received.readline() == "got it\n"
        clock.now += 3600
        assert worker.unload_if_idle() == 10 and worker.loaded
    finally:
        with open(tmp_path / "release", "w") as release:
            release.write("go\n")
        embedding.join()
    assert answers[0][0, 3] == 1.0  # the fake's row for a 3-character text
    assert worker.unload_if_idle() == 10 and worker.loaded  # the embed's end was a use
    clock.now += 10
    assert worker.unload_if_idle() == 10 and not worker.loaded


def test_a_child_lost_mid_request_fails_that_embed_and_the_next_starts_another(
        tmp_path: Path) -> None:
    worker = fake(tmp_path)
    try:
        worker.embed(["warm"])
        (tmp_path / "die-once").touch()
        with pytest.raises(EmbedderUnavailable, match="exit status 3"):
            worker.embed(["abcd"])
        assert worker.embed(["abcd"])[0, 4] == 1.0
        assert worker.load_count == 2
    finally:
        worker.close()


def test_a_child_killed_while_idle_is_replaced_by_the_next_embed(tmp_path: Path) -> None:
    worker = fake(tmp_path)
    try:
        worker.embed(["warm"])
        pid = worker.pid
        assert pid is not None
        os.kill(pid, 9)
        wait_until(lambda: not worker.loaded)
        assert worker.embed(["ab"])[0, 2] == 1.0
        assert worker.load_count == 2
    finally:
        worker.close()


def test_a_failure_in_the_child_is_raised_here_and_the_child_keeps_serving(
        tmp_path: Path) -> None:
    worker = fake(tmp_path)
    try:
        (tmp_path / "fail").touch()
        with pytest.raises(EmbedderUnavailable, match=r"model\.onnx is missing here"):
            worker.embed(["abc"])
        with pytest.raises(EmbedderUnavailable, match=r"model\.onnx is missing here"):
            worker.load()
        (tmp_path / "fail").unlink()
        assert worker.embed(["abc"])[0, 3] == 1.0
        assert worker.load_count == 1
    finally:
        worker.close()


def test_a_command_that_cannot_start_is_embedder_unavailable(tmp_path: Path) -> None:
    worker = WorkerEmbedder(command=[str(tmp_path / "no-such-python")])
    with pytest.raises(EmbedderUnavailable, match="cannot start its process"):
        worker.embed(["abc"])


def frames(*requests: object) -> io.BytesIO:
    stream = io.BytesIO()
    for ident, request in enumerate(requests):
        body = request if isinstance(request, bytes) else json.dumps(request).encode()
        _write_frame(stream, _ID.pack(ident) + body)
    stream.seek(0)
    return stream


class LoadingHashing(HashingEmbedder):
    loads = 0

    def load(self) -> None:
        self.loads += 1


def test_serve_answers_each_frame_and_a_bad_one_with_a_failure() -> None:
    """The child's loop itself, on in-memory streams: a bad request does not end it."""
    embedder = LoadingHashing()
    answers = io.BytesIO()
    serve(embedder, frames({"texts": ["deploy", "redis"]}, b"not json", {"nothing": 1},
                           {"load": True}), answers)
    answers.seek(0)
    got = [_read_frame(answers) for _ in range(4)]
    assert _read_frame(answers) is None  # end-of-file: every request answered, then it ended
    by_id = {_ID.unpack_from(frame)[0]: frame[_ID.size:] for frame in got if frame}
    assert sorted(by_id) == [0, 1, 2, 3]  # the batch (0) runs beside the others
    first, bad_json, no_texts, load = (by_id[i] for i in range(4))
    assert first[:1] == _OK
    rows = np.frombuffer(first[1:], dtype="<f4").reshape(2, 384)
    assert np.array_equal(rows, embedder.embed(["deploy", "redis"]))
    for failed, expected in ((bad_json, "JSONDecodeError"), (no_texts, "KeyError")):
        assert failed[:1] == _FAILED and json.loads(failed[1:])["type"] == expected
    assert load == _OK and embedder.loads == 1


def test_an_answer_of_the_wrong_size_is_a_failure() -> None:
    from local_store.embed_worker import _decode
    with pytest.raises(ChildFailed, match="answered 5 bytes for 1 rows"):
        _decode(_OK + b"1234", 1)


def test_the_child_exits_when_its_parent_is_killed() -> None:
    script = textwrap.dedent("""
        import sys
        from local_store.embed_worker import WorkerEmbedder
        worker = WorkerEmbedder()
        worker.embed(["start the child"])
        print(worker.pid, flush=True)
        sys.stdin.read()
    """)
    with subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as parent:
        try:
            assert parent.stdout is not None
            child = int(parent.stdout.readline())
            assert not gone(child)
        finally:
            parent.kill()
    wait_until(lambda: gone(child))  # it read end-of-file on its stdin


def embed_in_threads(worker: WorkerEmbedder, texts: list[str]) -> list[object]:
    """Each text embedded on its own thread: its row, or what the embed raised."""
    results: list[object] = [None] * len(texts)

    def one(i: int) -> None:
        try:
            results[i] = worker.embed([texts[i]])
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_answers_given_last_first_reach_the_threads_that_asked(tmp_path: Path) -> None:
    (tmp_path / "gather").write_text("3")  # three requests in flight, answered in reverse
    worker = fake(tmp_path)
    try:
        results = embed_in_threads(worker, ["a", "bb", "ccc"])
        for length, rows in enumerate(results, start=1):
            assert isinstance(rows, np.ndarray) and rows[0, length] == 1.0
    finally:
        worker.close()


def test_a_child_lost_with_requests_in_flight_fails_them_all(tmp_path: Path) -> None:
    (tmp_path / "gather").write_text("2")
    worker = fake(tmp_path)
    try:
        (tmp_path / "die-once").touch()
        results = embed_in_threads(worker, ["a", "bb"])
        assert all(isinstance(r, EmbedderUnavailable) and "exit status 3" in str(r)
                   for r in results), results
        (tmp_path / "gather").write_text("1")
        assert worker.embed(["abcd"])[0, 4] == 1.0
        assert worker.load_count == 2
    finally:
        worker.close()


def test_concurrent_embeds_get_the_in_process_vectors() -> None:
    """Several threads at once, as the daemon's saves and recalls embed: each its own rows."""
    texts = [f"{i}: " + TEXTS[i % len(TEXTS)] for i in range(24)]
    expected = MiniLMEmbedder().embed(texts)
    worker = WorkerEmbedder()
    try:
        results = embed_in_threads(worker, texts)
        for i, rows in enumerate(results):
            assert isinstance(rows, np.ndarray), rows
            assert float(np.abs(rows[0] - expected[i]).max()) <= 1e-5
    finally:
        worker.close()


def test_the_child_imports_neither_the_store_nor_msgspec() -> None:
    """What the child process imports is what it holds resident, for as long as it runs."""
    script = ("import sys, local_store.embed_worker; "
              "print(sorted(m for m in ('local_store.store', 'msgspec', 'sqlite3', 'onnx', "
              "'onnxruntime', 'tokenizers', 'syncd') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]", out  # onnxruntime and tokenizers come with the first load


def test_the_packages_names_are_still_there() -> None:
    import local_store
    assert set(local_store.__all__) <= set(dir(local_store))
    for name in local_store.__all__:
        assert getattr(local_store, name).__name__ == name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        local_store.Nope  # noqa: B018


def test_the_child_outlasts_a_sigterm_meant_for_its_parent() -> None:
    """systemd's stop signals every process of the unit: the daemon drains its requests, so the
    child must still answer them."""
    worker = WorkerEmbedder()
    try:
        first = worker.embed(["deploy with make release"])
        pid = worker.pid
        assert pid is not None
        os.kill(pid, 15)
        assert np.array_equal(worker.embed(["deploy with make release"]), first)
        assert worker.pid == pid and worker.load_count == 1
    finally:
        worker.close()
    assert gone(pid)


class GatedHashing(HashingEmbedder):
    """Holds every batch (several texts) until ``gate`` is set; one text goes straight through."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def embed(self, texts: list[str]) -> np.ndarray:
        if len(texts) > 1:
            assert self.gate.wait(60), "the test never opened the gate"
        return super().embed(texts)


def test_a_query_is_not_held_behind_a_batch_that_runs() -> None:
    """A re-embedding pass or a batch save runs beside the one-text requests: a prompt's query
    sent after it is answered first."""
    embedder = GatedHashing()
    requests_r, requests_w = os.pipe()
    answers_r, answers_w = os.pipe()
    with open(requests_r, "rb") as requests, open(answers_w, "wb") as answers, \
            open(requests_w, "wb") as ask, open(answers_r, "rb") as answered:
        loop = threading.Thread(target=serve, args=(embedder, requests, answers))
        loop.start()
        try:
            _write_frame(ask, _ID.pack(7) + json.dumps({"texts": ["deploy", "redis"]}).encode())
            _write_frame(ask, _ID.pack(8) + json.dumps({"texts": ["solo"]}).encode())
            first = _read_frame(answered)
            assert first is not None and _ID.unpack_from(first)[0] == 8  # the batch is held
            embedder.gate.set()
            second = _read_frame(answered)
            assert second is not None and _ID.unpack_from(second)[0] == 7
            rows = np.frombuffer(second[_ID.size + 1:], dtype="<f4").reshape(2, 384)
            assert np.array_equal(rows, HashingEmbedder().embed(["deploy", "redis"]))
        finally:
            embedder.gate.set()
            ask.close()  # end-of-file: the loop ends
            loop.join()
