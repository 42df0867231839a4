"""The ``syncd`` console script: the prompt hook's command line goes straight to
``syncd.hook``; every other goes to ``syncd.cli`` (argparse), unchanged.

Rules:
  * Imports nothing at module level beyond ``sys`` and ``pathlib`` (loaded at start-up
    already): the hook runs on every prompt, and the full CLI's imports (argparse,
    urllib.request, the config's msgspec) cost it ~3× a bare interpreter start.
  * Only the spellings argparse is sure to read as the hook take the short way: the global
    options ``--config X``/``--config=X``/``--data-dir X``/``--data-dir=X`` exactly (in any
    order, the last one winning, a value that is neither empty nor starting with ``-``), then
    ``recall --hook`` and nothing else. Anything else — an abbreviation, another option, a
    query — is argparse's to read (and to refuse), as before.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    flags = hook_flags(sys.argv[1:])
    if flags is not None:
        from syncd.hook import run_hook
        return run_hook(*flags)
    from syncd.cli import main as cli_main
    return cli_main()


def hook_flags(argv: list[str]) -> tuple[Path | None, Path | None] | None:
    """``(--config, --data-dir)`` when ``argv`` is the hook's command line, else None."""
    values: dict[str, str] = {}
    at = 0
    while at < len(argv) and argv[at] != "recall":
        name, eq, value = argv[at].partition("=")
        if name not in ("--config", "--data-dir") or (not eq and at + 1 == len(argv)):
            return None
        value, at = (value, at + 1) if eq else (argv[at + 1], at + 2)
        if not value or value.startswith("-"):
            return None
        values[name] = value
    if argv[at:] != ["recall", "--hook"]:
        return None
    config, data_dir = values.get("--config"), values.get("--data-dir")
    return (None if config is None else Path(config),
            None if data_dir is None else Path(data_dir))
