"""syncd: the local memory daemon (config, HTTP + MCP, sync engine, gate, CLI)."""

import importlib.metadata

try:  # one version source: pyproject.toml, as the installed distribution's metadata carries it
    __version__ = importlib.metadata.version("syncd")
except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"
