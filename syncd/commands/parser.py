"""The ``syncd`` command line's grammar: every subcommand, its options and help texts
(``syncd/completion.py`` builds the shell completions from it).

Rules:
  * The global options ``--config`` and ``--data-dir`` are also accepted after a subcommand's
    name (``_global_options``); ``hub`` has its own ``--data-dir``, the hub's.
  * A number argument is refused here when it is not finite (JSON has no such numbers).
  * Nothing heavy is imported: the prompt hook reached through argparse builds this parser.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from syncd import __version__


def _finite(text: str) -> float:
    """A number argument: ``nan`` and ``inf`` are refused here, naming the value (JSON has no
    such numbers; the daemon would never see the request)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _seconds(text: str) -> float:
    """A duration argument: a finite number of seconds above zero."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return value


# How long `syncd sync` waits for its pass, where every other command waits the client's 30 s.
# A pass legitimately takes minutes: a first pull of a large store (bench/HISTORY.md), and a
# manual pass queues behind a scheduled one. Ten minutes covers several of those; past it a
# person is better told to look at `syncd status` than left waiting (the pass goes on).
SYNC_TIMEOUT_SECS = 600.0


LIST_DEFAULT, LIST_MAX = 20, 200  # the store's own list cap is LIST_LIMIT_MAX


# local_store.records.MEMORY_TYPES, spelled out: importing local_store costs ~0.3 s of start-up,
# which the prompt hook pays on every prompt (a test keeps the two equal).
SAVE_TYPES = ("fact", "decision", "preference", "learning", "summary", "procedure", "entity")


def _global_options(*, data_dir: bool) -> argparse.ArgumentParser:
    """``--config`` and ``--data-dir``, as every subcommand accepts them too: ``syncd run
    --data-dir D`` means ``syncd --data-dir D run``. SUPPRESS leaves the attribute unset when
    the option is not given after the command, so one given before it still counts."""
    options = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    options.add_argument("--config", type=Path, help="config file (default: the platform's)")
    if data_dir:
        options.add_argument("--data-dir", type=Path,
                             help="data directory (overrides the config)")
    return options


def _command(group: Any, name: str, *, help: str, **options: Any) -> argparse.ArgumentParser:
    """A subcommand whose own ``--help`` says what it does (argparse shows a subparser's
    ``description`` there, not the ``help`` its parent lists), and that takes the global
    options after its name as well (``_global_options``; ``hub`` has its own ``--data-dir``,
    the hub's)."""
    parents = [_global_options(data_dir=options.pop("own_data_dir", False) is False)]
    parser: argparse.ArgumentParser = group.add_parser(
        name, help=help, description=options.pop("description", help), parents=parents,
        **options)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="syncd", description="Local memory daemon for coding "
                                     "agents: a SQLite memory store served over HTTP and MCP.")
    parser.add_argument("--version", action="version", version=f"syncd {__version__}")
    parser.add_argument("--config", type=Path, help="config file (default: the platform's)")
    parser.add_argument("--data-dir", type=Path, help="data directory (overrides the config)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = _command(sub, "run", help="run the daemon in the foreground")
    run.add_argument("--listen", help="HOST:PORT (default 127.0.0.1:7777)")
    run.add_argument("--allow-non-loopback", action="store_true",
                     help="allow a non-loopback listen address (only behind your own auth)")

    _command(sub, "mcp", help="MCP over stdio, forwarding to the daemon, which it starts "
                   "when none runs (what a coding agent launches)")
    status = _command(sub, "status", help="show the daemon's state")
    status.add_argument("--json", action="store_true")
    list_ = _command(sub, "list", help="list memories, newest first")
    list_.add_argument("--realm", action="append", help="only this realm (repeat for several)")
    list_.add_argument("--type", dest="memory_type", help="only this memory type")
    list_.add_argument("--tag", action="append", dest="tags",
                       help="only memories with this tag (repeat: every one of them)")
    list_.add_argument("--limit", type=int, default=LIST_DEFAULT,
                       help=f"at most this many (default {LIST_DEFAULT}, up to {LIST_MAX})")
    list_.add_argument("--json", action="store_true")
    get = _command(sub, "get", help="show one memory, its text and its edges")
    get.add_argument("memory_id", metavar="ID")
    get.add_argument("--json", action="store_true")
    history = _command(sub, "history", help="show a memory's versions, newest first (the "
                             "current one, then earlier and conflicting ones)")
    history.add_argument("memory_id", metavar="ID")
    choice = history.add_mutually_exclusive_group()
    choice.add_argument("--restore", type=int, metavar="N",
                        help="make version N current (a new edit, which syncs)")
    choice.add_argument("--dismiss", type=int, metavar="N",
                        help="mark conflict N reviewed, keeping the current version")
    history.add_argument("--json", action="store_true")
    delete = _command(sub, "delete", help="delete a memory (a tombstone syncs; --hard also "
                            "purges its text from this store)")
    delete.add_argument("memory_id", metavar="ID")
    delete.add_argument("--hard", action="store_true", help="purge the text, not just hide it")
    delete.add_argument("--json", action="store_true")
    edit = _command(sub, "edit", help="edit a memory: its text in $VISUAL or $EDITOR (saved "
                    "as an edit that syncs), or the fields given")
    edit.add_argument("memory_id", metavar="ID")
    edit.add_argument("--title", help="a new title (\"\" clears it)")
    edit.add_argument("--tag", action="append", dest="tags",
                      help="the tags, replacing the old ones (repeat for several)")
    edit.add_argument("--importance", type=_finite, help="0 to 1")
    edit.add_argument("--json", action="store_true")
    stop = _command(sub, "stop", help="stop the running daemon cleanly (a service manager "
                          "may start it again: `syncd service uninstall` stops it for good)")
    stop.add_argument("--json", action="store_true")

    recall = _command(sub, "recall", help="recall memories for a query (prints the context)")
    recall.add_argument("query", nargs="?")
    recall.add_argument("--hook", action="store_true",
                        help="agent prompt hook: read the hook JSON (prompt, cwd) from stdin, "
                        "print the hook's output; silent and exit 0 on any failure")
    recall.add_argument("--realm", action="append", default=[],
                        help="only this realm (repeat for several; default: all)")
    recall.add_argument("--tag", action="append", default=[], dest="tags",
                        help="only memories with this tag (repeat: every one of them)")
    recall.add_argument("--type", dest="memory_type")
    recall.add_argument("--limit", type=int)
    recall.add_argument("--json", action="store_true")

    save = _command(sub, "save", help="save a memory")
    save.add_argument("content", help="the memory's text; - reads it from standard input")
    save.add_argument("--title")
    save.add_argument("--type", dest="memory_type", help=f"{', '.join(SAVE_TYPES)} "
                      "(default fact; another value is stored as fact, with a note)")
    save.add_argument("--tag", action="append", default=[], dest="tags",
                      help="a tag (repeat for several)")
    save.add_argument("--realm", help="the project it belongs to (default: default)")
    save.add_argument("--topic-key", help="a stable key: a later save with the same key and "
                      "realm updates this memory instead of adding one")
    save.add_argument("--importance", type=_finite, help="0 to 1 (default 0.5)")
    save.add_argument("--json", action="store_true", help="the daemon's answer, as JSON")

    export = _command(sub, "export", help="export memories as the plane's JSON (or as "
                      "Markdown to read and grep: --format markdown)")
    export.add_argument("--format", choices=["json", "markdown"], default="json",
                        help="json (default; what `syncd import` takes, with vectors) or "
                        "markdown (one section per memory with its fields and edges, no "
                        "vectors)")
    export.add_argument("--realm", help="only this realm's memories (edges are never "
                        "filtered by realm, as the plane)")
    export.add_argument("-o", "--output", type=Path, help="file, replaced only by a complete "
                        "export (default: stdout)")

    imp = _command(sub, "import", help="import a JSON export ({memory_nodes, memory_edges})")
    imp.add_argument("file", type=Path, metavar="FILE", help="an export (`syncd export`'s or "
                     "the plane's); `-` reads standard input")
    imp.add_argument("--json", action="store_true",
                     help="the counts and every refused row, as JSON")

    backup = _command(sub, "backup", help="online backup of the store to DEST (safe while "
                            "the daemon runs); the copy is integrity-checked")
    backup.add_argument("dest", type=Path)
    backup.add_argument("--json", action="store_true")
    restore = _command(sub, "restore", help="make a backup the store again (the daemon must "
                             "be stopped); the store it replaces is kept beside it")
    restore.add_argument("source", type=Path)
    restore.add_argument("--json", action="store_true")

    service = _command(sub, "service", help="install or uninstall the systemd user service / "
                             "launchd agent, or show its status")
    service.add_argument("action", choices=["install", "uninstall", "status"])
    which = service.add_mutually_exclusive_group()
    which.add_argument("--systemd", dest="platform", action="store_const", const="systemd",
                       help="the systemd user unit (the default, except on macOS)")
    which.add_argument("--launchd", dest="platform", action="store_const", const="launchd",
                       help="the launchd agent (the default on macOS)")
    service.add_argument("--print", dest="print_only", action="store_true",
                         help="write the rendered unit to stdout only")

    sync = _command(sub, "sync", help="run one sync pass now and print its report")
    sync.add_argument("--json", action="store_true", help="the whole report, as JSON")
    sync.add_argument("--timeout", type=_seconds, default=SYNC_TIMEOUT_SECS, metavar="SECS",
                      help=f"wait this long for the pass (default {SYNC_TIMEOUT_SECS:g}); "
                      "past it the pass goes on in the daemon (`syncd status` shows it)")

    open_ = _command(sub, "open", help="print (and, on a desktop, open) a one-time login URL "
                           "for the web page")
    open_.add_argument("--no-browser", action="store_true",
                       help="only print the URL, even where a desktop exists")
    open_.add_argument("--json", action="store_true",
                       help="print {url, expires_in} as JSON (opens no browser)")

    hub = _command(sub, "hub", help="run the reference control plane (`syncd hub token "
                   "create|list|revoke --data-dir DIR` manages its API tokens)",
                   description="Run the reference control plane. Its admin commands: "
                   "`syncd hub token create --role read|write|admin --name NAME`, `syncd hub "
                   "token list`, `syncd hub token revoke --name NAME` (its API tokens) and "
                   "`syncd hub key` (prints the entitlement public key laptops pin) and `syncd hub "
                   "invite --name NAME` (a one-use invite for `syncd join`; `--list`, `--revoke "
                   "ID`); each takes "
                   "the hub's store: --data-dir, --store or --store-file.", own_data_dir=True)
    hub.add_argument("--data-dir", dest="hub_data_dir", type=Path,
                     help="the hub's data directory (default: hub.data_dir)")
    hub.add_argument("--listen", help="HOST:PORT (default: hub.listen, 127.0.0.1:8787)")
    hub.add_argument("--cursor", choices=["ingest", "origin"],
                     help="changes feed order: ingest (default) or origin (as Kyma)")
    where = hub.add_mutually_exclusive_group()
    where.add_argument("--store", help="sqlite (default: the data directory) or a PostgreSQL "
                       "DSN, postgresql://… (default: hub.store)")
    where.add_argument("--store-file", type=Path, help="a 0600 file holding the PostgreSQL DSN "
                       "(default: hub.store_file)")

    license_ = _command(sub, "license", help="install an offline licence (an entitlement "
                              "token signed by a pinned key)")
    license_.add_argument("action", choices=["install"])
    license_.add_argument("file", type=Path)
    license_.add_argument("--json", action="store_true")

    _command(sub, "demo", help="run the embedded demo: a hub and two laptops on loopback")
    completion = _command(sub, "completion", help="print a shell completion script: "
                          'eval "$(syncd completion bash)" in ~/.bashrc; zsh likewise in '
                          "~/.zshrc; fish: syncd completion fish > "
                          "~/.config/fish/completions/syncd.fish")
    completion.add_argument("shell", choices=["bash", "zsh", "fish"])

    join = _command(sub, "join", help="pair this device with a hub: trade an invite (`syncd "
                         "hub invite`) for its own token and write the config's sync settings")
    join.add_argument("invite", metavar="INVITE", help="the invite; - reads it from standard "
                      "input")
    join.add_argument("--force", action="store_true", help="replace a different "
                      "control_plane.url and an existing token file")
    join.add_argument("--json", action="store_true", help="what was written, as JSON")

    setup = _command(sub, "setup", help="connect an agent: merge syncd's hooks and MCP server "
                           "into its config files (`setup claude-code`), or print the server "
                           "entry for another MCP client (`setup mcp --print`)")
    agents = setup.add_subparsers(dest="agent", required=True, metavar="AGENT")
    claude = _command(agents, "claude-code", help="Claude Code: the prompt and session-start "
                               "hooks in its settings, the MCP server in its MCP config")
    claude.add_argument("--settings", type=Path, default=Path("~/.claude/settings.json"),
                        help="its settings file (default ~/.claude/settings.json)")
    claude.add_argument("--mcp-config", type=Path, default=Path("~/.claude.json"),
                        help="its MCP config file (default ~/.claude.json)")
    claude.add_argument("--dry-run", action="store_true",
                        help="print the files as they would be written; write nothing")
    claude.add_argument("--uninstall", action="store_true",
                        help="remove syncd's entries only")
    mcp_ = _command(agents, "mcp", help="the MCP server entry, for any MCP client")
    mcp_.add_argument("--print", action="store_true", required=True, dest="print_entry",
                      help="print it as JSON")
    return parser
