"""The ``syncd`` command line. Exit codes: 0 ok, 2 usage/config error, 75 temporary failure."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from syncd import __version__

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_TEMPFAIL = 75


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="syncd", description="Local memory daemon for coding agents.")
    parser.add_argument("--version", action="version", version=f"syncd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the embedded demo (hub + two laptops on loopback)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        print("syncd demo: not yet — the demo arrives with the sync issue (hub + two laptops).")
        return EXIT_OK
    return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
