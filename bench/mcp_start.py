"""Benchmark how soon ``syncd mcp`` gives an agent its tools, and its first call with no daemon.

    .venv/bin/python bench/mcp_start.py [--runs 7] [--before OTHER_CHECKOUT/.venv/bin/syncd]

Whole processes, a temporary HOME, the hashing embedder, alternated round by round so every
row sees the same minutes of this machine. Each row times from the spawn of the process to the
answer named:

  * ``bare``: ``python -c pass`` (the interpreter start every row pays);
  * ``tools/list, no daemon``: ``syncd mcp`` (``[mcp] autostart = false``) to its ``tools/list``
    answer, nothing listening;
  * ``tools/list, daemon up``: the same with a daemon running;
  * ``first call, autostart``: ``syncd mcp`` with no daemon to the answer of a ``save_memory``
    that had to wait for the daemon it started (the daemon is stopped after each round);
  * ``before`` (with ``--before``): another checkout's ``syncd mcp`` to ``tools/list`` with a
    daemon up (before autostart, the handshake was forwarded to the daemon).

Prints median and p95 in ms and each median's ratio to ``bare``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYNCD = ROOT / ".venv" / "bin" / "syncd"
HANDSHAKE: list[dict[str, object]] = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "bench", "version": "0"}}},
             {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]
SAVE: dict[str, object] = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "save_memory", "arguments": {"content": "bench memory"}}}


def env_for(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCD_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_DATA_HOME=str(home / ".local/share"), SYNCD_EMBEDDING_MODEL="hashing")
    return env


def timed(command: list[str], env: dict[str, str], messages: list[dict[str, object]],
          last_id: int | None) -> float:
    """Seconds from spawn to the answer with ``last_id`` (None: to the exit)."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
    proc.stdin.flush()
    try:
        while last_id is not None:
            answer = json.loads(proc.stdout.readline())
            if answer.get("id") == last_id:
                assert "result" in answer and not answer["result"].get("isError"), answer
                break
        elapsed = time.perf_counter() - started
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    return elapsed if last_id is not None else time.perf_counter() - started


def config(path: Path, autostart: bool) -> Path:
    path.write_text(f'[daemon]\nlisten = "127.0.0.1:0"\n[mcp]\nautostart = '
                    f'{"true" if autostart else "false"}\nstart_timeout_secs = 60\n')
    return path


def syncd(conf: Path, data: Path, *args: str) -> list[str]:
    return [str(SYNCD), "--config", str(conf), "--data-dir", str(data), *args]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--before", type=Path, help="another checkout's syncd script")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        env = env_for(home)
        off, on = config(home / "off.toml", False), config(home / "on.toml", True)
        up_data, auto_data = home / "up", home / "auto"
        daemon = subprocess.Popen(syncd(off, up_data, "run"), env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert daemon.stderr is not None
        while b"ready on" not in daemon.stderr.readline():
            assert daemon.poll() is None, "the daemon did not start"
        rows: dict[str, list[float]] = {}
        try:
            for _ in range(args.runs):
                rows.setdefault("bare", []).append(
                    timed([sys.executable, "-c", "pass"], env, [], None))
                rows.setdefault("tools/list, no daemon", []).append(timed(
                    syncd(off, home / "none", "mcp"), env, HANDSHAKE, 2))
                rows.setdefault("tools/list, daemon up", []).append(timed(
                    syncd(off, up_data, "mcp"), env, HANDSHAKE, 2))
                if args.before is not None:
                    plain = home / "plain.toml"  # an older syncd knows no [mcp]
                    plain.write_text('[daemon]\nlisten = "127.0.0.1:0"\n')
                    before = [str(args.before), "--config", str(plain), "--data-dir",
                              str(up_data), "mcp"]
                    rows.setdefault("before: tools/list, daemon up", []).append(
                        timed(before, env, HANDSHAKE, 2))
                rows.setdefault("first call, autostart", []).append(timed(
                    syncd(on, auto_data, "mcp"), env, [*HANDSHAKE, SAVE], 3))
                subprocess.run(syncd(on, auto_data, "stop"), env=env, check=True,
                               capture_output=True, timeout=60)
        finally:
            subprocess.run(syncd(on, auto_data, "stop"), env=env, capture_output=True,
                           timeout=60)
            daemon.terminate()
            daemon.wait(timeout=60)
    bare = statistics.median(rows["bare"])
    print(f"{'row':34} {'median ms':>10} {'p95 ms':>8} {'× bare':>7}")
    for name, values in rows.items():
        values.sort()
        p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
        median = statistics.median(values)
        print(f"{name:34} {median * 1000:10.1f} {p95 * 1000:8.1f} {median / bare:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
