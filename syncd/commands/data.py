"""The commands on the store as a whole: ``export`` and ``import`` (through the daemon, rules
in ``syncd/transfer.py``), ``backup`` and ``restore`` (on the data directory itself)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from syncd.client import Client
from syncd.exits import EXIT_FAILED, EXIT_OK, EXIT_TEMPFAIL


def export_command(client: Client, args: argparse.Namespace) -> int:
    from syncd.transfer import export_file
    return export_file(client, args)


def import_command(client: Client, args: argparse.Namespace, max_body: int) -> int:
    from syncd.transfer import import_file
    return import_file(client, args, max_body)


def backup_command(data_dir: Path, dest: Path, as_json: bool = False) -> int:
    from local_store.backups import BackupError, backup
    try:
        memories = backup(data_dir, dest)
    except BackupError as exc:
        print(f"syncd: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps({"memories": memories, "dest": str(dest.absolute()),
                      "integrity_check": "ok"}) if as_json else
          f"backed up {memories} memories to {dest} (integrity_check: ok)")
    return EXIT_OK


def restore_command(data_dir: Path, source: Path, as_json: bool = False) -> int:
    from local_store import StoreLockedError
    from local_store.backups import BackupError, restore
    try:
        done = restore(data_dir, source)
    except StoreLockedError as exc:
        print(f"syncd: stop the daemon before restoring: {exc.message}", file=sys.stderr)
        return EXIT_TEMPFAIL
    except BackupError as exc:
        print(f"syncd: {exc.message}; nothing was changed", file=sys.stderr)
        return EXIT_FAILED
    kept = f"; the store it replaced is kept as {done.replaced}" if done.replaced else ""
    print(json.dumps({"memories": done.memories, "source": str(source.absolute()),
                      "data_dir": str(data_dir.absolute()),
                      "replaced": None if done.replaced is None else str(done.replaced),
                      "other_install": done.other_install}) if as_json else
          f"restored {done.memories} memories from {source} into {data_dir}{kept}")
    if done.other_install:
        print("syncd: note: the backup is of another install, whose identity this data "
              "directory now has. Keep it only where that install no longer runs: a hub leaves "
              "each one's writes out of the other's passes (only anti-entropy repairs them). To "
              "set up another machine, let it sync from the control plane instead.",
              file=sys.stderr)
    return EXIT_OK
