"""Issue 34, point 1: syncd installed as a package. A wheel built from this tree's files holds
everything the code reads from its packages (the default model's tokenizer and reference
vectors, the web page, the migrations, the unit templates); plain ``pip install`` of it into a
fresh venv (no editable install, no system site-packages, the dependencies pinned by
constraints.txt) gives a ``syncd`` that, run from a directory outside the checkout, passes
``syncd demo``, serves the web page and recalls with the offline model (``syncd run``), runs
``syncd hub``, and renders a service unit that starts that venv's script.

Slow (a venv and its dependencies; timings in bench/HISTORY.md): ``make wheel-check`` does the
same by hand and shows the demo.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.syncd.processes import finish, wait_ready

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("protocol", "local_store", "syncd")
INSTALL_SECS = 600  # building, a venv, its dependencies (from pip's cache or the index)
RUN_SECS = 180

pytestmark = [pytest.mark.slow, pytest.mark.timeout(INSTALL_SECS + 4 * RUN_SECS)]


@dataclass(frozen=True)
class Install:
    wheel: Path
    venv: Path
    home: Path
    outside: Path  # the working directory of every command: not the checkout

    @property
    def syncd(self) -> str:
        return str(self.venv / "bin" / "syncd")

    def env(self) -> dict[str, str]:
        """Nothing that could reach the checkout or another install: no PYTHONPATH, no
        SYNCD_* overrides, HOME and the XDG dirs of its own."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "PYTHON"))
               and k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
        env.update(HOME=str(self.home), XDG_CONFIG_HOME=str(self.home / ".config"),
                   XDG_DATA_HOME=str(self.home / ".local/share"),
                   PATH=f"{self.venv / 'bin'}:/usr/bin:/bin")
        return env

    def run(self, *args: str, timeout: float = RUN_SECS) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.syncd, *args], capture_output=True, text=True,
                              env=self.env(), cwd=self.outside, timeout=timeout, check=False)


def tree_files() -> list[Path]:
    """The checkout's files as a fresh clone has them, plus any not yet committed (never what
    .gitignore names: .venv, build/, caches)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout
    return [Path(name) for name in listed.decode().split("\0")
            if name and (ROOT / name).is_file()]


def build_wheel(out: Path) -> Path:
    """The wheel of a copy of the tree: a build in the checkout would leave build/ there, and a
    stale build/lib can put files in the wheel that the tree no longer has."""
    source = out / "source"
    for name in tree_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-w", str(out / "dist"), str(source)],
                          capture_output=True, text=True, timeout=INSTALL_SECS, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (out / "dist").glob("syncd-*.whl")
    return wheel


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    root = tmp_path_factory.mktemp("wheel-install")
    wheel = build_wheel(root)
    venv = root / "venv"
    # No pip in the venv: the checkout's pinned pip installs into it (``--python``), so the venv
    # holds the wheel and its dependencies only. No bytecode compiled ahead (``--no-compile``):
    # Python compiles what it imports on first use instead.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=INSTALL_SECS)
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                           "install", "--quiet", "--no-compile",
                           "-c", str(ROOT / "constraints.txt"), str(wheel)],
                          capture_output=True, text=True, timeout=INSTALL_SECS, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (root / "home").mkdir()
    (root / "outside").mkdir()
    yield Install(wheel=wheel, venv=venv, home=root / "home", outside=root / "outside")


def package_data(root: Path) -> set[str]:
    """Every file of the three packages that is not Python source: what the code reads
    through ``importlib.resources`` or beside ``__file__``."""
    return {str(path.relative_to(root)) for package in PACKAGES
            for path in (root / package).rglob("*")
            if path.is_file() and path.suffix not in (".py", ".pyc")
            and "__pycache__" not in path.parts}


def test_the_wheel_holds_the_model_the_web_page_and_the_migrations(install: Install) -> None:
    with zipfile.ZipFile(install.wheel) as wheel:
        names = set(wheel.namelist())
        for name in ("local_store/data/all-MiniLM-L6-v2/tokenizer.json",
                     "local_store/data/all-MiniLM-L6-v2/reference.npz",
                     "local_store/data/background.txt",
                     "syncd/web/static/index.html", "syncd/web/static/app.js",
                     "syncd/web/static/app.css", "local_store/schema/0001_init.sql",
                     "syncd/hub/pg/schema/0001_hub.sql", "syncd/deploy_templates/syncd.service"):
            assert name in names, name
        tracked = {str(p) for p in tree_files()}
        shipped = {name for name in package_data(ROOT) if name in tracked}
        assert shipped - names == set(), "package files the wheel leaves out"
        for name in shipped:
            assert wheel.read(name) == (ROOT / name).read_bytes(), name
        modules = {str(p) for p in tree_files() if p.parts[0] in PACKAGES and p.suffix == ".py"}
        assert modules - names == set(), "modules the wheel leaves out"


def test_the_venv_runs_the_wheel_not_the_checkout(install: Install) -> None:
    probe = ("import json, sys, local_store, protocol, syncd, syncd.entry, importlib.metadata as m;"
             "print(json.dumps({'files': [local_store.__file__, protocol.__file__, "
             "syncd.__file__], 'path': sys.path, 'prefix': sys.prefix, "
             "'version': m.version('syncd')}))")
    proc = subprocess.run([str(install.venv / "bin" / "python"), "-c", probe],
                          capture_output=True, text=True, env=install.env(), cwd=install.outside,
                          timeout=RUN_SECS, check=True)
    seen = json.loads(proc.stdout)
    assert all(Path(f).is_relative_to(install.venv) for f in seen["files"]), seen["files"]
    assert not any(p and Path(p).resolve().is_relative_to(ROOT) for p in seen["path"])
    site = [p for p in seen["path"] if p.endswith("site-packages")]
    pth = [f.read_text() for s in site for f in Path(s).glob("*.pth")]
    assert not any(str(ROOT) in text for text in pth)  # no editable install's link
    assert not [f for s in site for f in Path(s).glob("__editable__*")]
    out = install.run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"syncd {seen['version']}"


def test_syncd_demo_passes_from_the_fresh_venv(install: Install) -> None:
    out = install.run("demo")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all-MiniLM-L6-v2" in out.stdout  # the default offline model, not the hashing one
    assert out.stdout.rstrip().endswith("Done: every check held."), out.stdout


async def spawn(install: Install, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        install.syncd, *args, env=install.env(), cwd=install.outside,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def command(install: Install, *args: str) -> str:
    proc = await spawn(install, *args)
    async with asyncio.timeout(RUN_SECS):
        out, err = await proc.communicate()
    assert proc.returncode == 0, (args, out.decode(), err.decode())
    return out.decode()


@contextlib.asynccontextmanager
async def serving(install: Install, *args: str
                  ) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """``syncd ARGS`` started and ready: the process and its URL; killed if the test leaves
    it running."""
    proc = await spawn(install, *args)
    try:
        yield proc, await wait_ready(proc, deadline=RUN_SECS)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_the_daemon_serves_the_web_page_and_recalls_with_the_offline_model(
        install: Install) -> None:
    data = str(install.home / "data")
    async with serving(install, "--data-dir", data, "run", "--listen", "127.0.0.1:0") as (
            daemon, url):
        async with aiohttp.ClientSession() as http:
            for name in ("app.js", "app.css"):
                async with http.get(f"{url}/static/{name}") as response:
                    assert response.status == 200, name
                    assert await response.read() == (
                        ROOT / "syncd/web/static" / name).read_bytes()
            login = (await command(install, "--data-dir", data, "open", "--no-browser")).split()[0]
            async with http.get(login) as response:  # the one-time link, then the page
                assert response.status == 200
                assert "<title>syncd</title>" in await response.text()
        fact = "The billing service keeps invoices in Postgres 16 on the eu-west-1 cluster."
        await command(install, "--data-dir", data, "save", fact, "--realm", "billing")
        context = await command(install, "--data-dir", data, "recall",
                                "which database holds the invoices", "--realm", "billing")
        assert fact in context
        status = json.loads(await command(install, "--data-dir", data, "status", "--json"))
        assert status["embedder"] == "all-MiniLM-L6-v2", status
        assert status["indexed_vectors"] == 1, status
        await command(install, "--data-dir", data, "stop")
        code, err = await finish(daemon, limit=RUN_SECS)
        assert code == 0, err


async def test_the_hub_runs_from_the_fresh_venv(install: Install) -> None:
    data = str(install.home / "hub")
    await command(install, "hub", "token", "create", "--data-dir", data, "--role", "read",
                  "--name", "auditor")
    async with serving(install, "hub", "--data-dir", data, "--listen", "127.0.0.1:0") as (
            hub, url):
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/healthz") as response:
                assert response.status == 200
            async with http.get(f"{url}/") as response:  # the hub's page
                assert response.status == 200
                assert "<html" in (await response.text()).lower()
        hub.terminate()
        code, err = await finish(hub, limit=RUN_SECS)
        assert code == 0, err


def test_the_service_unit_starts_the_installed_script(install: Install) -> None:
    out = install.run("--data-dir", str(install.home / "data"), "service", "install",
                      "--systemd", "--print")
    assert out.returncode == 0, out.stderr
    exec_start = next(x for x in out.stdout.splitlines() if x.startswith("ExecStart="))
    assert exec_start.split()[0] == f"ExecStart={install.syncd}"
    assert exec_start.endswith(" run")
