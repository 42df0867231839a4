"""The daemon's idle-unload timer (issue 36): asks the embedder when it said to, stops when it
says never; ``embedding.idle_unload_secs`` reaches the MiniLM embedder, which the daemon runs
in a child process that the unload and the daemon's exit both stop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
import sys
from pathlib import Path

from local_store.embed_minilm import MiniLMEmbedder
from local_store.embed_worker import WorkerEmbedder
from syncd.config import EmbeddingConfig
from syncd.daemon import IdleUnloading, make_embedder, unload_when_idle
from tests.syncd.processes import cli, env_for, finish, wait_ready


class CountingEmbedder:
    """Answers 0 s (ask again now) twice, then never."""

    def __init__(self) -> None:
        self.calls = 0

    def unload_if_idle(self) -> float:
        self.calls += 1
        return 0.0 if self.calls < 3 else math.inf


async def test_the_timer_asks_again_when_told_and_stops_on_never() -> None:
    embedder = CountingEmbedder()
    async with asyncio.timeout(30):
        await unload_when_idle(embedder)
    assert embedder.calls == 3


def test_the_configured_idle_time_reaches_minilm_and_hashing_has_no_timer() -> None:
    minilm = make_embedder(EmbeddingConfig(model="all-MiniLM-L6-v2", idle_unload_secs=7.5),
                           idle_unload=True)
    assert isinstance(minilm, IdleUnloading)
    assert minilm.idle_unload_secs == 7.5  # type: ignore[attr-defined]
    assert not minilm.loaded  # type: ignore[attr-defined]  # construction loads nothing
    threaded = make_embedder(EmbeddingConfig(model="all-MiniLM-L6-v2", threads=1), idle_unload=True)
    assert isinstance(threaded, WorkerEmbedder)
    assert threaded._command[-4:-2] == ["--threads", "1"]  # the child's command line
    kept = make_embedder(EmbeddingConfig(model="all-MiniLM-L6-v2", idle_unload_secs=0),
                         idle_unload=True)
    assert isinstance(kept, MiniLMEmbedder)  # never unloaded: no child process to stop
    assert not isinstance(make_embedder(EmbeddingConfig(model="hashing"), idle_unload=True),
                          IdleUnloading)


def embedding_children(pid: int) -> list[int]:
    """The daemon's child processes running ``local_store.embed_worker``."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for kid in (task / "children").read_text().split():
            with contextlib.suppress(FileNotFoundError):
                if b"local_store.embed_worker" in Path(f"/proc/{kid}/cmdline").read_bytes():
                    found.append(int(kid))
    return found


async def line_with(proc: asyncio.subprocess.Process, text: str) -> str:
    assert proc.stderr is not None
    async with asyncio.timeout(120):
        while line := (await proc.stderr.readline()).decode():
            if text in line:
                return line
    raise AssertionError(f"the daemon exited before logging {text!r}")


async def run_minilm(home: Path, data: str, idle: str) -> asyncio.subprocess.Process:
    env = env_for(home)
    env.update(SYNCD_EMBEDDING_MODEL="all-MiniLM-L6-v2", SYNCD_EMBEDDING_IDLE_UNLOAD_SECS=idle)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "syncd", "--data-dir", data, "run", "--listen", "127.0.0.1:0",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    await wait_ready(proc, deadline=120)
    return proc


async def stopped(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    code, err = await finish(proc, limit=120)
    assert code == 0, err


async def test_the_daemon_runs_minilm_in_a_child_that_the_idle_unload_stops(
        tmp_path: Path) -> None:
    """``syncd run`` with MiniLM: a save starts the model's process, the idle unload stops it
    (reaped: no child left), and the next save starts another; both memories get a vector."""
    data = str(tmp_path / "data")
    proc = await run_minilm(tmp_path, data, idle="1")
    try:
        for text in ("deploys go out with make release", "the cache lives in redis"):
            code, _, err = await cli(tmp_path, "--data-dir", data, "save", text)
            assert code == 0, err
            await line_with(proc, "unloaded all-MiniLM-L6-v2")  # the save's child, stopped
            assert embedding_children(proc.pid) == []
        code, out, err = await cli(tmp_path, "--data-dir", data, "status", "--json")
        assert code == 0, err
        status = json.loads(out)
        assert status["indexed_vectors"] == 2 and status["embedder_error"] is None, status
    finally:
        await stopped(proc)


async def test_the_daemons_exit_stops_its_minilm_process(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    proc = await run_minilm(tmp_path, data, idle="600")
    try:
        code, _, err = await cli(tmp_path, "--data-dir", data, "save", "deploy on fridays")
        assert code == 0, err
        (child,) = embedding_children(proc.pid)  # the save's; it stays ten minutes
    finally:
        await stopped(proc)
    # reaped by the daemon before it exited (an orphan would still be exiting, or a zombie)
    assert not process_exists(child)


def process_exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()
