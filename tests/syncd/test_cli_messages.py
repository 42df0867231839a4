"""Messages a person reads from the installed ``syncd`` (issue 35), run in a subprocess."""

from __future__ import annotations

from pathlib import Path

from tests.syncd.processes import cli


async def test_a_bare_port_is_refused_with_the_address_meant(tmp_path: Path) -> None:
    data = tmp_path / "data"
    code, _, err = await cli(tmp_path, "--data-dir", str(data), "run", "--listen", "17807")
    assert code == 2
    assert "--listen 17807: expected host:port; for this machine only, 127.0.0.1:17807" in err
    assert not data.exists()  # nothing made in a data dir the daemon never ran in
