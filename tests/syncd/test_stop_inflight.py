"""A stop signal while `syncd sync` is in the daemon, waiting for the entitlement keeper,
whose own fetch holds a hung control plane: the keeper and the plane client were stopped under
it, and its fetch then ran on the closed session ("Session is closed"): 500 internal, and a
traceback in the log. A real ``syncd run`` and a real CLI process, a real hub behind the fault
proxy."""

from __future__ import annotations

import asyncio
import shutil
import signal
from pathlib import Path

from syncd.exits import EXIT_TEMPFAIL
from tests.syncd.faultproxy import FaultProxy
from tests.syncd.processes import finish, wait_ready
from tests.syncd.test_cli_failures import hung_plane
from tests.syncd.test_daemon import cli, start


async def test_a_sync_in_flight_at_a_stop_signal_is_told_the_daemon_is_stopping(
        tmp_path: Path) -> None:
    data, client = tmp_path / "data", tmp_path / "client"
    async with hung_plane(tmp_path) as (plane, env):
        proc = await start(data, "--listen", "127.0.0.1:0", **env)
        url = await wait_ready(proc)
        async with asyncio.timeout(30):
            await plane.wait_count(1, "GET", "/entitlement")  # the keeper's fetch holds its lock
        async with FaultProxy(url) as front:  # the CLI's way in: to see its request arrive
            await asyncio.to_thread(client.mkdir, mode=0o700)  # its token, no state file
            await asyncio.to_thread(shutil.copy, data / "api-token", client / "api-token")
            sync = asyncio.create_task(cli(client, "sync", SYNCD_DAEMON_LISTEN=front.url
                                           .removeprefix("http://")))
            async with asyncio.timeout(30):
                await front.wait_count(1, "POST", "/v1/agent/sync/run")
            await asyncio.sleep(0.5)  # forwarded: in the daemon, waiting for the keeper's lock
            proc.send_signal(signal.SIGTERM)
            code, log = await finish(proc)
            sync_code, out, err = await sync
    assert code == 0, log
    assert "Traceback" not in log and " ERROR " not in log, log
    assert (sync_code, out) == (EXIT_TEMPFAIL, ""), err  # temporary: try again later
    assert err == ("syncd: 503 stopping: the daemon is stopping, so it did not ask the control "
                   "plane; try again once it runs again\n"), err
