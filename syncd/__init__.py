"""syncd: the local memory daemon (config, HTTP + MCP, sync engine, gate, CLI)."""

__version__ = "0.1.0"
