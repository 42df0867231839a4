"""Crash-at-a-pull-stage child (RELIABILITY R4):
``python crash_pull_child.py DATA_DIR HUB_URL TOKEN STAGE``.

Opens the laptop at DATA_DIR, installs a SIGKILL at STAGE and runs one sync pass. The crash is
installed by wrapping real functions in this process only (the crash harness, not a mock: every
wrapped call still runs the real code up to the crash point):

  after_fetch                PlaneClient.changes returned the page; nothing applied yet
  mid_apply                  Writer.apply_nodes ran its executemany's; the transaction is open
  after_apply_before_cursor  replica.set_state is about to write the pulled cursor (same tx)
  after_commit               store.replication.pull returned: rows and cursor are committed

If the pass ends without reaching the stage the child exits 3 (the parent then fails: a crash
that never fired proves nothing).
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script: sys.path[0] is tests/sync
    sys.path.insert(0, str(REPO_ROOT))

from local_store import replica  # noqa: E402
from local_store.services.replication import Replication  # noqa: E402
from local_store.writes import Writer  # noqa: E402
from syncd.sync.plane import PlaneClient  # noqa: E402
from tests.sync.harness import start_laptop  # noqa: E402

STAGES = ("after_fetch", "mid_apply", "after_apply_before_cursor", "after_commit")
NO_CRASH_EXIT = 3


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install(stage: str) -> None:
    if stage == "after_fetch":
        real_changes = PlaneClient.changes_spooled  # what the engine pulls with

        @functools.wraps(real_changes)
        async def changes(self: PlaneClient, *args: Any, **kwargs: Any) -> Any:
            await real_changes(self, *args, **kwargs)
            die()

        PlaneClient.changes_spooled = changes  # type: ignore[method-assign]
    elif stage == "mid_apply":
        real_apply = Writer.apply_nodes

        @functools.wraps(real_apply)
        def apply_nodes(self: Writer, *args: Any, **kwargs: Any) -> None:
            real_apply(self, *args, **kwargs)
            assert self.conn.in_transaction
            die()

        Writer.apply_nodes = apply_nodes  # type: ignore[method-assign]
    elif stage == "after_apply_before_cursor":
        real_set_state: Callable[[Writer, Mapping[str, str | None]], None] = replica.set_state

        def set_state(writer: Writer, state: Mapping[str, str | None]) -> None:
            if state.get("cursor") is not None:  # the pull's cursor, not plane_model etc.
                assert writer.conn.in_transaction
                die()
            real_set_state(writer, state)

        replica.set_state = set_state
    elif stage == "after_commit":
        real_pull = Replication.pull

        @functools.wraps(real_pull)
        async def pull(self: Replication, *args: Any, **kwargs: Any) -> Any:
            await real_pull(self, *args, **kwargs)
            die()

        Replication.pull = pull  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")


async def main(data_dir: Path, url: str, token: str, stage: str) -> int:
    laptop = await start_laptop("crash", data_dir, url, token)
    try:
        install(stage)
        report = await laptop.sync()
    finally:
        await laptop.close()
    print(f"the pass ended without reaching {stage} (ok={report.ok}, error={report.error})",
          file=sys.stderr)
    return NO_CRASH_EXIT


if __name__ == "__main__":
    data, hub_url, hub_token, crash_stage = sys.argv[1:5]
    sys.exit(asyncio.run(main(Path(data), hub_url, hub_token, crash_stage)))
