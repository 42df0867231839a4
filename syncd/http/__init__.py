"""The daemon's HTTP API: one app factory, thin handlers (decode → one store call → encode)."""

from syncd.http.app import create_app

__all__ = ["create_app"]
