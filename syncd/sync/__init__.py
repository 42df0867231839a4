"""Replication with a Kyma-compatible control plane: the HTTP client and the engine."""
