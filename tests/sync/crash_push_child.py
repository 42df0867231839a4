"""Crash-after-the-plane-committed-a-push child (docs/sync-causality.md):
``python crash_push_child.py DATA_DIR HUB_URL TOKEN WALL_NS``.

Opens the laptop at DATA_DIR on a wall clock stopped at WALL_NS (the parent's ``FakeWall``
reading), and runs one sync pass that SIGKILLs itself as soon as ``PlaneClient.import_rows``
returns: the plane has committed the push and answered, and the outbox entry is not cleared
yet. The crash is installed by wrapping the real function in this process only (not a mock:
the real request runs to completion). If the pass ends without pushing, the child exits 3.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script: sys.path[0] is tests/sync
    sys.path.insert(0, str(REPO_ROOT))

from syncd.sync.plane import PlaneClient  # noqa: E402
from tests.sync.harness import start_laptop  # noqa: E402

NO_CRASH_EXIT = 3


def install() -> None:
    real_import = PlaneClient.import_rows

    @functools.wraps(real_import)
    async def import_rows(self: PlaneClient, *args: Any, **kwargs: Any) -> Any:
        await real_import(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    PlaneClient.import_rows = import_rows  # type: ignore[method-assign]


async def main(data_dir: Path, url: str, token: str, wall_ns: int) -> int:
    laptop = await start_laptop("crash", data_dir, url, token, wall=lambda: wall_ns)
    try:
        install()
        report = await laptop.sync()
    finally:
        await laptop.close()
    print(f"the pass ended without pushing (ok={report.ok}, error={report.error})",
          file=sys.stderr)
    return NO_CRASH_EXIT


if __name__ == "__main__":
    data, hub_url, hub_token, wall_reading = sys.argv[1:5]
    sys.exit(asyncio.run(main(Path(data), hub_url, hub_token, int(wall_reading))))
