"""The store's branch of syncd's error tree (``protocol/errors.py`` draws the whole tree). Each
class carries its stable ``code`` and the HTTP ``status`` the daemon answers it with.

    StoreError              500 store_error
    ├── ValidationError     422 invalid: bad input; names the field; nothing was written
    ├── NotFoundError       404 not_found: the id does not exist (or is a tombstone)
    ├── StoreLockedError    503 store_locked: another process holds the data directory
    ├── StoreUnusableError  500 store_unusable: the data directory cannot be one, or its
    │                       database file is not a usable syncd store (not SQLite, corrupt, or
    │                       migrated by a newer syncd); either is left as it was
    ├── StoreFullError      507 disk_full: the disk (or the database's page limit) is full;
    │                       nothing was written
    ├── StoreClosedError    503 store_closed: the store was used after close()
    └── BackupError         500 backup_failed (``backups.py``)
"""

from __future__ import annotations

from protocol.errors import SyncdError


class StoreError(SyncdError):
    status, code = 500, "store_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)


class ValidationError(StoreError):
    status, code = 422, "invalid"
    field: str  # always named

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotFoundError(StoreError):
    """``field``: the argument that named the missing id, read from the ``"field: "`` every
    raise starts its message with (``None`` without one), so the error shape can name it."""

    status, code = 404, "not_found"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        name, colon, _ = message.partition(": ")
        self.field = name if colon and name.isidentifier() else None


class StoreLockedError(StoreError):
    status, code = 503, "store_locked"


class StoreUnusableError(StoreError):
    status, code = 500, "store_unusable"


class StoreFullError(StoreError):
    status, code = 507, "disk_full"


class StoreClosedError(StoreError):
    status, code = 503, "store_closed"
