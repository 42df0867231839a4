"""The running daemon's state file, ``<data-dir>/daemon.json`` (pid and URL), for clients.

Kept free of heavy imports: the prompt hook and ``syncd mcp`` read it on every start.
"""

from __future__ import annotations

import json
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing, for the prompt hook
if TYPE_CHECKING:
    from typing import Any

STATE_FILENAME = "daemon.json"


def state_path(data_dir: Path) -> Path:
    return data_dir / STATE_FILENAME


def read_state(data_dir: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(state_path(data_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None
