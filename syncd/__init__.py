"""syncd: the local memory daemon (config, HTTP + MCP, sync engine, gate, CLI).

``__version__`` is read on first use, not at import: ``importlib.metadata`` has a cost
the prompt hook (``syncd.hook``, run on every prompt) would pay without needing it.
"""

from __future__ import annotations


def __getattr__(name: str) -> str:
    if name != "__version__":
        raise AttributeError(f"module 'syncd' has no attribute {name!r}")
    import importlib.metadata
    try:  # one version source: pyproject.toml, as the installed distribution's metadata carries it
        version = importlib.metadata.version("syncd")
    except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
        version = "0+unknown"
    globals()["__version__"] = version
    return version
