"""Benchmark the prompt hook process: ``syncd recall --hook`` against a running daemon.

    .venv/bin/python bench/hook.py [--runs 15] [--before OTHER_CHECKOUT/.venv/bin/syncd]
                                   [--no-bytecode]

Starts a real daemon (``syncd run``, hashing embedder, a temporary HOME) holding a few
memories, then times whole processes, alternated round by round so every row sees the same
minutes of this machine:

  * ``bare``: ``.venv/bin/python -c pass``, the interpreter the console script starts with;
  * ``hook``: ``.venv/bin/syncd --data-dir D recall --hook``, the payload on stdin, as Claude
    Code runs it (no config file, no ``SYNCD_*`` variable: the defaults, computed in
    ``syncd.hook``);
  * ``hook, config file (kept)``: the same with ``--config`` naming a file that sets an
    option (a usual config), its answer kept in the cache ``syncd.hook_config`` writes — every
    prompt after the first one after an edit;
  * ``hook, config file, first run``: the same with the cache deleted before each run (not
    timed): read with ``tomllib``, then kept;
  * ``hook, SessionStart (kept)``: the config file too, with Claude Code's ``SessionStart``
    payload;
  * ``hook via argparse``: the full CLI's path (``syncd.cli.main``) to the same hook code;
  * ``before`` (with ``--before``): another checkout's console script, e.g. main's, with no
    config file and with the config file.

Every process runs with compiled bytecode, as an installed syncd does (pip writes the .pyc
files at install; Python on first import): PYTHONDONTWRITEBYTECODE is dropped and
PYTHONPYCACHEPREFIX names a directory in the temporary HOME, filled by the warm-up. With
``--no-bytecode`` every process gets PYTHONDONTWRITEBYTECODE=1 and no prefix instead: syncd's
modules are then compiled from source on every run (~4 ms more for the hook rows here).

Every prompt row must print the same answer, the SessionStart row a non-empty one (checked),
and the kept rows must find the cache (checked after the warm-up). Prints median and p95 in ms
and the ratio of each median to ``bare``'s; the target is ≤ 2× bare for the hook with no
config, with a config file and at SessionStart (the kept rows; the first run is shown beside).
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
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/http.py
VENV_BIN = ROOT / ".venv" / "bin"

from syncd.hook_config import CACHE_FILE_NAME, RACY_NS  # noqa: E402 (after the path fix)
from syncd.places import default_cache_dir  # noqa: E402

PAYLOAD = json.dumps({"session_id": "bench", "transcript_path": "/dev/null",
                      "cwd": "/work/billing-api", "hook_event_name": "UserPromptSubmit",
                      "prompt": "how do I ship billing with make release?"}).encode()
SESSION_PAYLOAD = json.dumps({"session_id": "bench", "transcript_path": "/dev/null",
                              "cwd": "/work/billing-api", "hook_event_name": "SessionStart",
                              "source": "startup"}).encode()
MEMORIES = [("ship billing with make release from the ops box", "billing-api"),
            ("billing invoices are numbered per tenant", "billing-api"),
            ("the web page runs on port 7777 behind the daemon", "global"),
            ("prefer small commits with one changelog line each", "default")]


def env_for(home: Path, bytecode: bool = True) -> dict[str, str]:
    """A temporary HOME and XDG dirs, no SYNCD_* variable (as a user's agent runs the hook),
    and bytecode written and read in HOME (or never, the module docstring)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SYNCD_") and k not in ("PYTHONDONTWRITEBYTECODE",
                                                        "PYTHONPYCACHEPREFIX")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_DATA_HOME=str(home / ".local/share"), XDG_CACHE_HOME=str(home / ".cache"))
    if bytecode:
        env["PYTHONPYCACHEPREFIX"] = str(home / "pycache")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def wait_until_cacheable(config: Path) -> None:
    """The hook keeps no answer for a config changed within ``RACY_NS`` (a racy file)."""
    st = config.stat()
    time.sleep(max(0.0, (max(st.st_mtime_ns, st.st_ctime_ns) + RACY_NS - time.time_ns()) / 1e9
                   + 0.1))


def start_daemon(data: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([str(VENV_BIN / "syncd"), "--data-dir", str(data), "run",
                             "--listen", "127.0.0.1:0"],
                            env={**env, "SYNCD_EMBEDDING_MODEL": "hashing"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    for line in proc.stderr:  # wait on its "ready on URL" line
        if b"ready on " in line:
            return proc
    raise SystemExit(f"the daemon exited before ready ({proc.wait()})")


def timed(argv: list[str], env: dict[str, str], stdin: bytes) -> tuple[float, bytes]:
    started = time.perf_counter()
    out = subprocess.run(argv, input=stdin, capture_output=True, env=env, check=True)
    return time.perf_counter() - started, out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--before", type=Path, help="another checkout's .venv/bin/syncd")
    parser.add_argument("--no-bytecode", action="store_true",
                        help="PYTHONDONTWRITEBYTECODE=1: compile syncd's modules on every run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        data, env = home / "data", env_for(home, bytecode=not args.no_bytecode)
        config = home / "with-a-setting.toml"
        config.write_text('[daemon]\nlog_level = "info"\n')
        daemon = start_daemon(data, env)
        try:
            for text, realm in MEMORIES:
                subprocess.run([str(VENV_BIN / "syncd"), "--data-dir", str(data), "save", text,
                                "--realm", realm], env=env, check=True, capture_output=True)
            wait_until_cacheable(config)
            cache = default_cache_dir(env) / CACHE_FILE_NAME
            hook = ["--data-dir", str(data), "recall", "--hook"]
            with_config = [str(VENV_BIN / "syncd"), "--config", str(config), *hook]
            rows: dict[str, list[str]] = {
                "bare (python -c pass)": [str(VENV_BIN / "python"), "-c", "pass"],
                "hook": [str(VENV_BIN / "syncd"), *hook],
                "hook, config file (kept)": with_config,
                "hook, config file, first run": with_config,
                "hook, SessionStart (kept)": with_config,
                "hook via argparse (syncd.cli)": [
                    str(VENV_BIN / "python"), "-c",
                    "import sys; from syncd.cli import main; sys.exit(main())", *hook],
            }
            if args.before:
                rows["before (--before)"] = [str(args.before), *hook]
                rows["before, config file"] = [str(args.before), "--config", str(config), *hook]
            before_each: dict[str, Callable[[], None]] = {
                "hook, config file, first run": lambda: cache.unlink(missing_ok=True)}
            times: dict[str, list[float]] = {name: [] for name in rows}
            answers: dict[str, set[bytes]] = {name: set() for name in rows}
            stdin = {name: SESSION_PAYLOAD if "SessionStart" in name else PAYLOAD for name in rows}
            for name, argv in rows.items():  # one untimed warm-up each (page cache, .pyc)
                timed(argv, env, stdin[name])
            assert cache.exists(), f"the config file's answer was not kept in {cache}"
            for _ in range(args.runs):
                for name, argv in rows.items():
                    before_each.get(name, lambda: None)()
                    elapsed, out = timed(argv, env, stdin[name])
                    times[name].append(elapsed)
                    answers[name].add(out)
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    hooks = set().union(*(answers[name] for name in rows
                          if not name.startswith("bare") and "SessionStart" not in name))
    assert len(hooks) == 1 and next(iter(hooks)), f"the hook rows answered differently: {hooks}"
    session = answers["hook, SessionStart (kept)"]
    assert len(session) == 1 and next(iter(session)), f"SessionStart answered {session}"
    report(times, args.runs, "from source" if args.no_bytecode else "bytecode")


def report(times: dict[str, list[float]], runs: int, modules: str) -> None:
    bare = statistics.median(times["bare (python -c pass)"])
    print(f"prompt hook process, {runs} runs each, alternated, modules {modules} "
          "(same answer from every hook row)")
    print(f"| {'process':<32} | p50 ms | p95 ms | × bare p50 |")
    print(f"|{'-' * 34}|--------|--------|------------|")
    for name, samples in times.items():
        p50 = statistics.median(samples)
        p95 = statistics.quantiles(samples, n=20, method="inclusive")[-1]
        print(f"| {name:<32} | {p50 * 1000:6.1f} | {p95 * 1000:6.1f} | {p50 / bare:10.2f} |")
    for name in ("hook", "hook, config file (kept)", "hook, SessionStart (kept)"):
        ratio = statistics.median(times[name]) / bare
        print(f"target {name} p50 ≤ 2× bare: {'met' if ratio <= 2 else 'missed'} (×{ratio:.2f})")


if __name__ == "__main__":
    main()
