"""The process exit codes every syncd command uses (the service units key restarts on them)."""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0  # done, or a clean stop
EXIT_FAILED: Final = 1  # a request or an operation failed
EXIT_CONFIG: Final = 2  # configuration or usage error: the units do not restart on it
EXIT_USAGE: Final = EXIT_CONFIG
EXIT_TEMPFAIL: Final = 75  # temporary (EX_TEMPFAIL: the data dir is locked, a port is taken…)
