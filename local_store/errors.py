"""The store's error tree. Each class has a stable ``code``; the daemon maps codes to HTTP.

    StoreError
    ├── ValidationError     bad input; names the field; nothing was written
    ├── NotFoundError       the id does not exist (or is a tombstone)
    ├── StoreLockedError    another process holds the data directory
    ├── StoreUnusableError  the data directory cannot be one, or its database file is not a
    │                       usable syncd store (not SQLite, corrupt, or migrated by a newer
    │                       syncd); either is left as it was
    ├── StoreFullError      the disk (or the database's page limit) is full; nothing was written
    └── StoreClosedError    the store was used after close()
"""

from __future__ import annotations


class StoreError(Exception):
    code = "store_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ValidationError(StoreError):
    code = "invalid"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotFoundError(StoreError):
    """``field``: the argument that named the missing id, read from the ``"field: "`` every
    raise starts its message with (``None`` without one), so the error shape can name it."""

    code = "not_found"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        name, colon, _ = message.partition(": ")
        self.field = name if colon and name.isidentifier() else None


class StoreLockedError(StoreError):
    code = "store_locked"


class StoreUnusableError(StoreError):
    code = "store_unusable"


class StoreFullError(StoreError):
    code = "disk_full"


class StoreClosedError(StoreError):
    code = "store_closed"
