"""The fused MiniLM graph, built once and kept on disk, so the daemon never imports ``onnx``.

``minilm_graph.fused_minilm`` needs ``onnx`` to read the shipped model file (~21 MB resident
that stays after the model unloads: a module cannot be unloaded). What it builds needs only
numpy and onnxruntime: the graph's bytes and its weights as int8 + scales (~23 MB). So the
embedder builds it in a child process (``python -m local_store.minilm_cache PATH``) that writes
it to the caller's cache directory, and reads it from there on every later load.

Rules:
  * The file's name holds the pinned model's sha256 and ``minilm_graph.GRAPH_VERSION``: another
    model file or another builder never reads a build that is not its own.
  * Written whole or not at all: a temporary file in the same directory, then ``os.replace``.
  * The file holds the sha256 of everything else in it; a file whose digest, names, shapes or
    types do not check out is reported, removed and built again (``read`` answers None).
  * Nothing here imports ``onnx`` but the child's ``main``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from local_store.minilm_graph import GRAPH_VERSION, FusedModel, Quantised, Tensor

log = logging.getLogger("local_store.minilm_cache")

BUILD_TIMEOUT_SECS = 600.0
_GRAPH, _DIGEST, _WORDS = "graph", "sha256", "words"
_FLOAT, _VALUES, _SCALE = "f:", "q:", "s:"  # prefixes of a weight's entries
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the directory holding local_store/


class CacheCorrupt(ValueError):
    """A cached build that does not check out; the message says what is wrong."""


def cache_path(cache_dir: Path, model_sha256: str) -> Path:
    return cache_dir / f"minilm-fused-{model_sha256[:16]}-v{GRAPH_VERSION}.npz"


def _entries(fused: FusedModel) -> dict[str, npt.NDArray[Any]]:
    out: dict[str, npt.NDArray[Any]] = {_GRAPH: np.frombuffer(fused.graph, dtype=np.uint8)}
    for name, tensor in [*fused.weights.items(), (_WORDS, fused.words)]:
        if isinstance(tensor, Quantised):
            out[_VALUES + name], out[_SCALE + name] = tensor.values, tensor.scale
        else:
            out[_FLOAT + name] = tensor
    return out


def _digest(entries: dict[str, npt.NDArray[Any]]) -> str:
    digest = hashlib.sha256()
    for name in sorted(entries):
        array = np.ascontiguousarray(entries[name])
        digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.data)
    return digest.hexdigest()


def write(path: Path, fused: FusedModel) -> None:
    """Keep ``fused`` at ``path``, atomically. Raises ``OSError`` when it cannot."""
    entries = _entries(fused)
    entries[_DIGEST] = np.array(_digest(entries))
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("wb") as out:
            np.savez(out, allow_pickle=False, **entries)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def read(path: Path) -> FusedModel | None:
    """The build kept at ``path``; None when there is none or it is corrupt (then removed)."""
    try:
        return _model(_load(path))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        log.warning("the cached MiniLM graph %s is unusable (%s); building it again", path, exc)
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return None


def _load(path: Path) -> dict[str, npt.NDArray[Any]]:
    with path.open("rb") as file, np.load(file, allow_pickle=False) as kept:  # ours to close
        entries = {name: kept[name] for name in kept.files}
    recorded = entries.pop(_DIGEST, None)
    if recorded is None or recorded.shape != () or str(recorded) != _digest(entries):
        raise CacheCorrupt("its sha256 does not match its contents")
    if _GRAPH not in entries or not {_FLOAT + _WORDS, _VALUES + _WORDS} & set(entries):
        raise CacheCorrupt("it lacks the graph or the word table")
    return entries


def _model(entries: dict[str, npt.NDArray[Any]]) -> FusedModel:
    tensors: dict[str, Tensor] = {}
    for key, array in entries.items():
        if key.startswith(_FLOAT):
            tensors[key.removeprefix(_FLOAT)] = array
        elif key.startswith(_VALUES):
            name = key.removeprefix(_VALUES)
            tensors[name] = Quantised(array, entries[_SCALE + name])
    words = tensors.pop(_WORDS)
    return FusedModel(entries[_GRAPH].tobytes(), tensors, words)


def build_in_child(path: Path) -> bool:
    """Build the fused graph into ``path`` in a child process (this one never imports onnx);
    whether it is there now. A child that fails is logged with the end of what it wrote."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "local_store.minilm_cache", str(path)], env=env,
            stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=BUILD_TIMEOUT_SECS, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("could not build the MiniLM graph in a child process (%s)", exc)
        return False
    if done.returncode != 0:
        log.warning("building the MiniLM graph into %s failed (exit %d): %s", path,
                    done.returncode, done.stderr.strip()[-600:])
        return False
    return path.is_file()


def main(argv: list[str]) -> int:
    """The child: build from the installed, pinned model file and keep it at ``argv[0]``."""
    from local_store.embed_minilm import EmbedderUnavailable, build_fused

    if len(argv) != 1:
        print("usage: python -m local_store.minilm_cache PATH", file=sys.stderr)
        return 2
    try:
        write(Path(argv[0]), build_fused())
    except (EmbedderUnavailable, OSError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
