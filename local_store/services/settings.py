"""``store.settings``: the memory settings every client is served, loaded at open and patched.

Rules:
  * A patch merges into the current settings (nested objects merge) and is persisted in one
    transaction; two patches at once run one after the other, the second merging the first.
  * Strings are redacted like any other text (settings are served to every client).
  * Stored settings partly unreadable load what can be read; the rest take their defaults
    until the next patch (and that is logged).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import msgspec

from local_store.arguments import msgspec_field
from local_store.errors import ValidationError
from local_store.redact import strip_json_object
from local_store.shell import Shell
from protocol.settings import DEFAULT_SETTINGS, MemorySettings, load_settings, merge_patch

log = logging.getLogger("local_store")


class Settings:
    """The store's memory settings (``store.settings``): ``current`` and ``put``."""

    def __init__(self, shell: Shell) -> None:
        self._shell = shell
        self._lock = asyncio.Lock()
        self.current: MemorySettings = DEFAULT_SETTINGS

    async def load(self) -> None:
        """Read the stored settings (at open)."""
        found = await self._shell._fetch("SELECT value FROM meta WHERE key = 'settings'")
        if found:
            self.current, problem = load_settings(found[0][0])
            if problem:
                log.warning("stored settings partly unreadable (%s): those fields take "
                            "their defaults until the next PUT of the settings", problem)

    async def put(self, patch: Mapping[str, object]) -> MemorySettings:
        """Patch the given keys and persist; returns the full settings."""
        async with self._lock:  # two patches at once: the second merges the first
            try:
                merged = merge_patch(self.current, strip_json_object(patch))
            except msgspec.ValidationError as exc:
                raise ValidationError(msgspec_field(str(exc)), str(exc)) from None
            encoded = msgspec.json.encode(merged).decode()
            await self._shell._write(lambda w: w.set_meta("settings", encoded))
            self.current = merged
            return merged
