"""Daemon memory (issue 36): resident memory of a real ``syncd run`` with all-MiniLM-L6-v2.

    .venv/bin/python bench/memory.py [--saves 1000] [--batch 100] [--queries 50] [--idle 6]
                                     [--baseline /path/to/another/checkout] [--embeds 200]

Starts the daemon as a subprocess (its own data dir under a temporary HOME, port 0, a config
file with ``[embedding] idle_unload_secs = --idle``), then over HTTP: one query (the model is
loaded), ``--saves`` saves through ``save_memories`` in batches of ``--batch``, ``--queries``
queries; it waits for the daemon's "unloaded" log line, times the first query after it, and
prints VmRSS (``/proc/PID/status``) after every step. ``--baseline`` runs the same steps against
the daemon of another checkout (e.g. main's worktree, before this change) in the same run, so
the two columns see the same minutes; that daemon gets the same config (an older one that does
not know ``idle_unload_secs`` is given none, and its unload rows stay empty).

Memory rows: the daemon's VmRSS; with its child processes (the daemon runs MiniLM in one,
``local_store.embed_worker``, stopped at the idle unload) as VmRSS summed and as Pss summed.

Then the embedder's query latency (one short text per ``embed``) and a 100-text batch, with the
session options before issue 36 (``PREVIOUS_TUNING``, in this process), the chosen ones
(``DEFAULT_TUNING``, in this process) and the chosen ones in a child process as the daemon runs
them (``WorkerEmbedder``), each query on all three in turn; ratio = that median / old's. Vectors
of old and new are compared (max |difference|, held to 1e-5 by the tests), and the child's must
equal new's bit for bit. With ``--baseline``, both daemons are also run side by side (the same
saves in each, then ``--embeds`` queries through HTTP, each query to both in turn): the
latency a client sees, in the same minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# bench/http.py would shadow the stdlib's http (http.client below): take bench/ off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))

import http.client  # noqa: E402

import numpy as np  # noqa: E402

from local_store.embed_minilm import (  # noqa: E402
    DEFAULT_TUNING,
    PREVIOUS_TUNING,
    MiniLMEmbedder,
)
from local_store.embed_worker import WorkerEmbedder  # noqa: E402
from syncd.places import default_cache_dir  # noqa: E402

WORDS = (
    "deploy release tag make build test sqlite writer lock daemon token redact merge conflict "
    "vector embedding cache retry timeout schema migration replica control plane agent memory "
    "python async queue index search cosine batch commit rollback config secret path file "
    "billing invoice postgres redis worker frontend react bundle route api auth session"
).split()
UNLOADED = "unloaded all-MiniLM-L6-v2"


def memory_text(rng: np.random.Generator, low: int, high: int) -> str:
    return " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), int(rng.integers(low, high))))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no Pss for {pid}")


def children(pid: int) -> list[int]:
    """``pid``'s child processes (the embedder's, once the daemon has started it)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with_kids = (task / "children").read_text().split()
        found += [int(kid) for kid in with_kids]
    return found


class Daemon:
    """``syncd run`` in a subprocess, its stderr read on a thread (lines kept, waited on)."""

    def __init__(self, home: Path, tree: Path, idle: float, knows_idle: bool,
                 model: str = "all-MiniLM-L6-v2") -> None:
        data = home / "data"
        config = home / "config.toml"
        lines = ["[daemon]", f'data_dir = "{data}"', 'listen = "127.0.0.1:0"',
                 'log_level = "info"']
        lines += ["[embedding]", f'model = "{model}"']
        if knows_idle:
            lines.append(f"idle_unload_secs = {idle}")
        config.write_text("\n".join(lines) + "\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCD_")}
        env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
                   XDG_DATA_HOME=str(home / ".local/share"), PYTHONPATH=str(tree))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "syncd", "--config", str(config), "run"], cwd=tree, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self.wait_for("ready on ", 60)
        url = ready.split("ready on ", 1)[1].strip()
        self.port = int(url.rsplit(":", 1)[1])
        self.token = (data / "api-token").read_text().strip()
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # EOF
            self._changed.notify_all()

    def wait_for(self, text: str, timeout: float, after: int = 0) -> str:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines[after:]:
                    if text in line:
                        return line
                if "" in self.lines[after:]:
                    raise RuntimeError(f"daemon exited:\n{''.join(self.lines)}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {text!r} in {timeout} s:\n{''.join(self.lines)}")
                self._changed.wait(left)

    @property
    def rss(self) -> float:
        return rss_mb(self.proc.pid)

    def measure(self, out: dict[str, Any], step: str) -> None:
        """The daemon's VmRSS, and with its child processes: their VmRSS summed (pages they
        share counted twice) and their Pss summed (shared pages split between them)."""
        kids = children(self.proc.pid)  # they live as long as the daemon: none exits here
        out[step] = self.rss
        out[f"{step}: + child processes"] = self.rss + sum(rss_mb(k) for k in kids)
        out[f"{step}: Pss, all processes"] = pss_mb(self.proc.pid) + sum(pss_mb(k) for k in kids)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        self.conn.request("POST", path, json.dumps(body).encode(), {
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{path}: {resp.status} {data[:300]!r}")
        return json.loads(data)

    def query(self, text: str) -> float:
        t0 = time.perf_counter()
        self.post("/v1/agent/memory/query", {"query": text, "limit": 5})
        return (time.perf_counter() - t0) * 1000

    def stop(self) -> None:
        self.conn.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_daemon(tree: Path, args: argparse.Namespace, knows_idle: bool,
               model: str = "all-MiniLM-L6-v2") -> dict[str, Any]:
    rng = np.random.default_rng(7)
    saves = [memory_text(rng, 12, 80) for _ in range(args.saves)]
    queries = [memory_text(rng, 3, 8) for _ in range(args.queries)]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="syncd-membench-") as tmp:
        daemon = Daemon(Path(tmp), tree, args.idle, knows_idle, model)
        try:
            daemon.measure(out, "at ready")
            t0 = time.perf_counter()
            for start in range(0, len(saves), args.batch):
                batch = saves[start:start + args.batch]
                daemon.post("/v1/agent/memory/tools/save_memories",
                            {"memories": [{"content": text} for text in batch]})
            out["saves (s)"] = time.perf_counter() - t0
            daemon.measure(out, f"after {len(saves)} saves")
            latencies = [daemon.query(q) for q in queries]
            out["query p50 over HTTP (ms)"] = statistics.median(latencies)
            daemon.measure(out, f"after {len(queries)} queries")
            if knows_idle:
                mark = len(daemon.lines)
                t0 = time.perf_counter()
                daemon.wait_for(UNLOADED, args.idle + 60, after=mark)
                out["unload came after (s)"] = time.perf_counter() - t0
                daemon.measure(out, "after the idle unload")
                out["first query after unload (ms)"] = daemon.query("how do we deploy a release")
                daemon.measure(out, "after reload")
        finally:
            daemon.stop()
    return out


def alternated_queries(trees: dict[str, tuple[Path, bool]], args: argparse.Namespace,
                       rounds: int) -> dict[str, list[float]]:
    """Query latency over HTTP (ms) with the daemons of ``trees`` up side by side, each given the
    same saves, queried in turn (the order rotating): the minutes are the same for all."""
    rng = np.random.default_rng(7)
    saves = [memory_text(rng, 12, 80) for _ in range(args.saves)]
    queries = [memory_text(rng, 3, 8) for _ in range(rounds)]
    times: dict[str, list[float]] = {name: [] for name in trees}
    with contextlib.ExitStack() as stack:
        daemons = {}
        for name, (tree, knows_idle) in trees.items():
            home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="syncd-alt-")))
            daemon = Daemon(home, tree, 3600.0, knows_idle)
            stack.callback(daemon.stop)
            for start in range(0, len(saves), args.batch):
                daemon.post("/v1/agent/memory/tools/save_memories",
                            {"memories": [{"content": t} for t in saves[start:start + args.batch]]})
            daemons[name] = daemon
        order = list(daemons.items())
        for i, text in enumerate(queries):
            for name, daemon in order[i % len(order):] + order[:i % len(order)]:
                times[name].append(daemon.query(text))
    return times


def embed_latencies(blocks: int) -> dict[str, dict[str, list[float]]]:
    """Query and 100-text batch latencies (ms), old and new options alternated in blocks."""
    pair: dict[str, Any] = {"old": MiniLMEmbedder(tuning=PREVIOUS_TUNING), "new": MiniLMEmbedder(),
                            "child": WorkerEmbedder(cache_dir=default_cache_dir())}
    rng = np.random.default_rng(11)
    queries = [memory_text(rng, 3, 8) for _ in range(25)]
    batch = [memory_text(rng, 12, 80) for _ in range(100)]
    for one in pair.values():
        one.embed(queries[:5])
        one.embed(batch)
    times: dict[str, dict[str, list[float]]] = {
        "query": {name: [] for name in pair}, "batch": {name: [] for name in pair}}
    items = list(pair.items())
    for block in range(blocks):  # every query on both, in turn (blocks of 25 drifted apart)
        for i, q in enumerate(queries):
            for name, one in items[(i + block) % 2:] + items[:(i + block) % 2]:
                t0 = time.perf_counter()
                one.embed([q])
                times["query"][name].append((time.perf_counter() - t0) * 1000)
        if block % 4 == 0:
            for name, one in items:
                t0 = time.perf_counter()
                one.embed(batch)
                times["batch"][name].append((time.perf_counter() - t0) * 1000)
    check = queries + batch
    diff = float(np.abs(pair["old"].embed(check) - pair["new"].embed(check)).max())
    times["max |old - new| vector difference"] = {"new": [diff]}
    same = bool((pair["child"].embed(check) == pair["new"].embed(check)).all())
    times["child process vectors identical to new"] = {"new": [float(same)]}
    pair["child"].close()
    return times


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--idle", type=float, default=6.0,
                        help="embedding.idle_unload_secs for the daemon under test")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout whose daemon runs the same steps (e.g. main)")
    parser.add_argument("--embeds", type=int, default=200,
                        help="query embeds per option set in the in-process comparison")
    args = parser.parse_args()

    columns: dict[str, dict[str, Any]] = {}
    # The floor: the same daemon and steps with the hashing embedder (no onnxruntime at all).
    columns["hashing floor"] = run_daemon(ROOT, args, False, model="hashing")
    if args.baseline is not None:
        knows = "idle_unload_secs" in (args.baseline / "syncd" / "config.py").read_text()
        columns["baseline"] = run_daemon(args.baseline.resolve(), args, knows)
    columns["this tree"] = run_daemon(ROOT, args, True)
    if args.baseline is not None:  # a second baseline run after ours: the minutes average out
        again = run_daemon(args.baseline.resolve(), args, knows)
        columns["baseline"] = {k: statistics.mean([v, again.get(k, v)])
                               for k, v in columns["baseline"].items()}
    side_by_side = None
    if args.baseline is not None:
        side_by_side = alternated_queries({"baseline": (args.baseline.resolve(), knows),
                                           "this tree": (ROOT, True)}, args, args.embeds)
    times = embed_latencies(max(2, args.embeds // 25))

    load1, load5, _ = os.getloadavg()
    print(f"bench/memory.py: {args.saves} saves in batches of {args.batch}, {args.queries} "
          f"queries, idle_unload_secs={args.idle:g}; cpus={os.cpu_count()} "
          f"loadavg(1m,5m)={load1:.2f},{load5:.2f}")
    names = list(columns)
    print(f"{'daemon (VmRSS MB unless noted)':<36}" + "".join(f"{n:>14}" for n in names))
    keys = list(columns["this tree"])
    for key in keys:
        cells = []
        for name in names:
            value = columns[name].get(key)
            cells.append(f"{value:>14.1f}" if value is not None else f"{'-':>14}")
        print(f"{key:<36}" + "".join(cells))
    if side_by_side is not None:
        print()
        print(f"{'query over HTTP, daemons side by side':<38}{'n':>6}{'p50':>9}{'p95':>9}"
              "  ratio to baseline p50")
        base = statistics.median(side_by_side["baseline"])
        for name, values in side_by_side.items():
            print(f"{name:<38}{len(values):>6}{statistics.median(values):>9.2f}"
                  f"{pct(values, 95):>9.2f}  ×{statistics.median(values) / base:.2f}")
    print()
    print(f"{'embedder (ms)':<36}{'n':>6}{'p50':>9}{'p95':>9}  ratio to old p50")
    for what in ("query", "batch"):
        old, new, child = times[what]["old"], times[what]["new"], times[what]["child"]
        for name, values in (("old options", old), ("new options", new),
                             ("new, child process", child)):
            ratio = statistics.median(values) / statistics.median(old)
            label = f"{what} embed, {name}"
            if what == "batch":
                label = f"100-text batch, {name}"
            print(f"{label:<36}{len(values):>6}{statistics.median(values):>9.2f}"
                  f"{pct(values, 95):>9.2f}  ×{ratio:.2f}")
    print(f"max |old - new| vector difference: "
          f"{times['max |old - new| vector difference']['new'][0]:.2e}")
    print("child process vectors identical to new: "
          f"{bool(times['child process vectors identical to new']['new'][0])}")
    print(f"old = {PREVIOUS_TUNING}\nnew = {DEFAULT_TUNING}\n"
          "child = new, in the daemon's local_store.embed_worker process")


if __name__ == "__main__":
    main()
