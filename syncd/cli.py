"""The ``syncd`` command line.

Exit codes: 0 ok · 1 the request failed (the message says why) · 2 usage or configuration
error · 75 temporary failure (daemon not running or answering 503 as it stops, data dir in
use, port taken).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

from syncd import __version__
from syncd.client import Client, ClientError, DaemonDown
from syncd.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_TEMPFAIL
from syncd.report import pass_summary, status_lines, when


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


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader left early (`syncd export | head`): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit flush too
        return EXIT_FAILED


def _command_at(argv: list[str]) -> int:
    """Where the subcommand is: after the global options ``--config`` and ``--data-dir``, in
    any order, spelled ``--opt X`` or ``--opt=X`` or abbreviated as argparse allows. Only
    ``hub token``/``hub key`` there are the hub's admin commands: ``syncd recall --realm hub
    key`` is a recall."""
    at = 0
    while at < len(argv):
        name, eq, _ = argv[at].partition("=")
        if len(name) < 3 or not name.startswith("--") or sum(
                option.startswith(name) for option in _GLOBAL_VALUED) != 1:
            return at
        at += 1 if eq else 2
    return at


_GLOBAL_VALUED = ("--config", "--data-dir")


HUB_ADMIN = ("token", "key", "invite")
_HUB_WHERE = ("--data-dir", "--store", "--store-file")


def _hub_admin(before: list[str], command: str, rest: list[str]) -> int:
    """``syncd hub token|key|invite``, which ``hub.admin`` parses. The hub's store is the one
    named after the command (``--data-dir``, ``--store``, ``--store-file``), else a
    ``--data-dir`` given before ``hub``, else the config's (``[hub] store``, ``store_file``
    or ``data_dir``, as ``syncd hub`` itself uses); ``--config`` goes before or after."""
    from syncd.hub import admin
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--config", type=Path)
    options.add_argument("--data-dir", type=Path)
    given = options.parse_known_args(before)[0]
    late = argparse.ArgumentParser(add_help=False)
    late.add_argument("--config", type=Path)
    after, rest = late.parse_known_args(rest)
    config_path = after.config or given.config
    named = any(word.partition("=")[0] in _HUB_WHERE for word in rest)
    if not named and not {"-h", "--help"} & set(rest):
        if given.data_dir is not None:
            rest = [*rest, "--data-dir", str(given.data_dir)]
        else:
            from syncd.config import ConfigError, load_config
            try:
                hub = load_config(config_path).hub
            except ConfigError as exc:
                print(f"syncd: {exc}", file=sys.stderr)
                return EXIT_CONFIG
            rest = [*rest, *(["--store-file", str(hub.store_file)] if hub.store_file else
                              ["--store", hub.store] if hub.store != "sqlite" else
                              ["--data-dir", str(hub.data_dir.expanduser())])]
    if command == "token":
        return admin.token_main(rest)
    if command == "key":
        return admin.key_main(rest)
    return admin.invite_main(rest, config_path)


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    at = _command_at(argv)
    if argv[at:at + 1] == ["hub"] and argv[at + 1:at + 2] and argv[at + 1] in HUB_ADMIN:
        return _hub_admin(argv[:at], argv[at + 1], argv[at + 2:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "recall" and args.hook:
        return _hook(args)
    if args.command == "recall" and args.query is None:
        parser.error("recall: QUERY is required (unless --hook)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s", stream=sys.stderr)
    if args.command == "setup":
        return _setup(args)
    if args.command == "completion":
        from syncd.completion import script
        print(script(args.shell, build_parser()), end="")
        return EXIT_OK
    if args.command == "join":
        return _join(args)
    if args.command == "demo":
        import asyncio

        from syncd.demo import run_demo
        code: int = asyncio.run(run_demo())
        return code
    try:
        settings = _settings(args)
    except ValueError as exc:
        print(f"syncd: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    # the daemon's level (its default, info, is what was set above)
    logging.getLogger().setLevel(settings["config"].daemon.log_level.upper())
    if args.command == "run":
        return _run(args, settings)
    if args.command == "hub":
        return _hub(args, settings)
    if args.command == "license":
        return _license(args, settings)
    if args.command == "backup":
        return _backup(settings["data_dir"], args.dest, args.json)
    if args.command == "restore":
        return _restore(settings["data_dir"], args.source, args.json)
    if args.command == "mcp":
        return _mcp(args, settings)
    if args.command == "service":
        return _service(args, settings)
    try:
        client = Client.for_data_dir(settings["data_dir"], settings["url"],
                                     listen_source=settings["listen_source"],
                                     start=settings["start"])
        if args.command == "import":  # its batches stay under the daemon's body limit
            return _import(client, args, settings["config"].daemon.max_body_bytes)
        return COMMANDS[args.command](client, args)
    except DaemonDown as exc:
        print(f"syncd: {exc}", file=sys.stderr)
        return EXIT_TEMPFAIL
    except ClientError as exc:
        print(f"syncd: {exc}", file=sys.stderr)
        # 503: stopping, or its store closing — the same command works once it runs again
        return EXIT_TEMPFAIL if exc.status == 503 else EXIT_FAILED


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """Config file + SYNCD_* env + flags → what the commands need."""
    from syncd.config import ConfigError, load_config, local_url, parse_config, parse_listen
    env = dict(os.environ)
    if getattr(args, "allow_non_loopback", False):  # the flag is the setting, for the file too
        env["SYNCD_DAEMON_ALLOW_NON_LOOPBACK"] = "true"
    try:
        if _creates_config(args):  # the defaults (and SYNCD_*), as the new file will hold
            config = parse_config(b"", env=env)
        else:
            config = load_config(args.config, env)
        default_listen = config.hub.listen if args.command == "hub" else config.daemon.listen
        flag = getattr(args, "listen", None)
        try:
            host, port = parse_listen(flag or default_listen)
        except ValueError as exc:
            if flag is None:  # the config's value: its own check names it
                raise
            raise ValueError(f"--listen {flag[:80]}: {exc}") from None
    except (ConfigError, ValueError) as exc:
        raise ValueError(str(exc)) from None
    data_dir = args.data_dir.expanduser() if args.data_dir else Path(config.daemon.data_dir)
    # "url" is where a client reaches the daemon before its state file says (0.0.0.0 → loopback)
    return {"config": config, "data_dir": data_dir, "host": host, "port": port,
            "url": local_url(host, port), "listen_source": _listen_source(args, env, config),
            "start": _start_command(args)}


def _listen_source(args: argparse.Namespace, env: Mapping[str, str], config: Any) -> str:
    """What set the daemon's address a client tries, as a phrase for "not running"."""
    from syncd.config import default_config_path, parse_config
    if getattr(args, "listen", None):
        return f"--listen {args.listen}"
    if env.get("SYNCD_DAEMON_LISTEN"):
        return f"SYNCD_DAEMON_LISTEN={env['SYNCD_DAEMON_LISTEN']}"
    path = (args.config or default_config_path(env)).expanduser().absolute()
    if config.daemon.listen != parse_config(b"", env={}).daemon.listen:
        return f"daemon.listen in {path}"
    where = f"none is set in {path}" if path.exists() else f"there is no {path}"
    return f"daemon.listen's default, {config.daemon.listen} ({where})"


def _start_command(args: argparse.Namespace) -> str:
    """``syncd run`` with the options that chose this data dir and config."""
    words = ["syncd"]
    if args.config is not None:
        words += ["--config", shlex.quote(str(args.config.expanduser().absolute()))]
    if args.data_dir is not None:
        words += ["--data-dir", shlex.quote(str(args.data_dir.expanduser().absolute()))]
    return " ".join([*words, "run"])


def _creates_config(args: argparse.Namespace) -> bool:
    """``service install`` with ``--config`` naming a file that is not there yet: install
    creates it, so it is not an error to read it first."""
    return (args.command == "service" and getattr(args, "action", None) == "install"
            and args.config is not None and not args.config.expanduser().exists())


def _run(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    import asyncio

    from local_store.versions import VersionPolicy
    from syncd.daemon import Daemon, StartupError, make_embedder
    config = settings["config"]
    try:
        embedder = make_embedder(config.embedding.model, config.embedding.cache_dir,
                                 config.embedding.threads, config.embedding.idle_unload_secs)
        daemon = Daemon(
            data_dir=settings["data_dir"], host=settings["host"], port=settings["port"],
            embedder=embedder, unix_socket=config.daemon.unix_socket,
            extra_hosts=tuple(config.daemon.allowed_hosts),
            max_body=config.daemon.max_body_bytes,
            plane_model=config.control_plane.embedding_model,
            shutdown_timeout=config.daemon.shutdown_timeout_secs,
            allow_non_loopback=args.allow_non_loopback or config.daemon.allow_non_loopback,
            sync=_sync_factory(config), entitlement=_entitlement_setup(config),
            versions=VersionPolicy(config.versions.keep, config.versions.max_age_days))
        return asyncio.run(daemon.run(ready=lambda url: print(f"syncd: ready on {url}",
                                                              file=sys.stderr, flush=True)))
    except StartupError as exc:
        print(f"syncd: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # anything else at start-up is reported, not a traceback dump
        logging.getLogger("syncd").exception("daemon failed")
        print(f"syncd: {exc}", file=sys.stderr)
        return EXIT_TEMPFAIL


def _sync_factory(config: Any) -> Any:
    """The daemon's sync runner, when ``control_plane.url`` is set (its token is read now, so
    a missing token file is a start-up error, not a failing loop)."""
    from syncd.daemon import StartupError
    from syncd.sync.engine import SyncOptions
    from syncd.sync.runner import SyncRunner, SyncSetupError, read_plane_token
    plane, sync = config.control_plane, config.sync
    if not plane.url:
        return None
    try:
        token = read_plane_token(plane.token_file)
    except SyncSetupError as exc:
        raise StartupError(str(exc), EXIT_CONFIG) from None
    options = SyncOptions(realm=plane.realm, plane_model=plane.embedding_model,
                          private_memories=plane.private_memories,
                          overlap_secs=sync.overlap_secs, push_batch_bytes=sync.push_batch_bytes,
                          anti_entropy_secs=sync.anti_entropy_secs, long_poll=sync.long_poll)
    return lambda store: SyncRunner.create(store, url=plane.url, token=token, options=options,
                                           interval=sync.interval_secs, jitter=sync.jitter,
                                           token_file=plane.token_file, proxy=plane.proxy,
                                           plane_embedder=_plane_embedder(config))


def _plane_embedder(config: Any) -> Any:
    """What builds an embedder of the plane's model, for memories a Kyma plane would otherwise
    get without a vector it can rank (``SyncEngine._plane_vectors``): bge-small-en-v1.5 from
    the files already under ``embedding.cache_dir`` (never downloaded). None for another model."""
    from local_store.embed_minilm import BGE_MODEL_ID, EmbedderUnavailable, FastEmbedBGE
    if config.control_plane.embedding_model != BGE_MODEL_ID:
        return None
    cache_dir = config.embedding.cache_dir

    def build() -> Any:
        if cache_dir is None:
            raise EmbedderUnavailable(f"{BGE_MODEL_ID} is unavailable: embedding.cache_dir is "
                                      "not set (the directory that holds its files)")
        return FastEmbedBGE(cache_dir, threads=config.embedding.threads)
    return build


def _entitlement_setup(config: Any) -> Any:
    from syncd.daemon import EntitlementSetup, StartupError
    from syncd.entitlement.token import pin
    try:
        pinned = pin(config.entitlement.public_keys)
    except ValueError as exc:
        raise StartupError(str(exc), EXIT_CONFIG) from None
    return EntitlementSetup(pinned=pinned, license_file=config.entitlement.license_file,
                            refresh_secs=config.entitlement.refresh_secs)


def _license(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    """Verify a licence against the pinned keys and this install's device id, install it,
    and ask a running daemon to re-check now."""
    import sqlite3

    from syncd.entitlement.gate import Gate
    from syncd.entitlement.token import TokenError, pin
    config, data_dir = settings["config"], settings["data_dir"]
    try:
        pinned = pin(config.entitlement.public_keys)
        raw = args.file.read_bytes()
        device = _device_id(data_dir)
        claims = Gate(data_dir, pinned, device,
                      license_file=config.entitlement.license_file).install_license(raw)
    except TokenError as exc:
        print(f"syncd license: {args.file}: {exc.reason}: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    except (ValueError, OSError, sqlite3.Error) as exc:
        print(f"syncd license: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(json.dumps({"plan": claims.plan, "features": list(claims.features),
                      "exp": claims.exp, "device": device}) if args.json else
          f"licence installed: plan {claims.plan}, features {', '.join(claims.features)}, "
          f"valid until {when(claims.exp)} (device {device})")
    try:
        Client.for_data_dir(data_dir, settings["url"], timeout=5).call(
            "POST", "/v1/agent/entitlement/check", {})
    except ClientError:
        pass  # not running: it reads the licence when it starts
    return EXIT_OK


def _device_id(data_dir: Path) -> str:
    """This install's device id: the store's replica id (read-only; the daemon may run)."""
    from local_store.db import DB_FILENAME, replica_id_of
    db = data_dir / DB_FILENAME
    if not db.exists():
        raise ValueError(f"no store in {data_dir}: run `syncd run` once first")
    replica = replica_id_of(db)
    if replica is None:
        raise ValueError(f"{db} has no replica id")
    return replica


def _hub(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    import asyncio

    import msgspec

    from syncd.daemon import StartupError, make_embedder
    from syncd.hub.dsn import resolve_dsn
    from syncd.hub.server import Hub
    config = settings["config"]
    data_dir = (args.hub_data_dir or args.data_dir or config.hub.data_dir).expanduser()
    try:
        if args.store is not None or args.store_file is not None:
            dsn = resolve_dsn(args.store, args.store_file)
        else:
            dsn = resolve_dsn(config.hub.store, config.hub.store_file)
    except ValueError as exc:
        print(f"syncd hub: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        hub = Hub(data_dir=data_dir, dsn=dsn, host=settings["host"], port=settings["port"],
                  embedder=make_embedder(config.embedding.model, config.embedding.cache_dir,
                                         config.embedding.threads),
                  config=msgspec.structs.replace(config.hub,
                                                 cursor=args.cursor or config.hub.cursor),
                  shutdown_timeout=config.daemon.shutdown_timeout_secs)
        return asyncio.run(hub.run(ready=lambda url: print(f"syncd hub: ready on {url}",
                                                           file=sys.stderr, flush=True)))
    except StartupError as exc:
        print(f"syncd hub: {exc}", file=sys.stderr)
        return exc.exit_code


def _export(client: Client, args: argparse.Namespace) -> int:
    from syncd.transfer import export_file
    return export_file(client, args)


def _import(client: Client, args: argparse.Namespace, max_body: int) -> int:
    from syncd.transfer import import_file
    return import_file(client, args, max_body)


def _sync(client: Client, args: argparse.Namespace) -> int:
    report = replace(client, timeout=args.timeout).call("POST", "/v1/agent/sync/run", {})
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for line in pass_summary(report):
            print(line)
    return EXIT_OK if report.get("ok") else EXIT_FAILED


def _mcp(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    """Lists the tools at once, daemon or not; a tool call starts the daemon when none answers
    (``[mcp] autostart``) and waits for it (syncd/autostart.py)."""
    from syncd.mcp_stdio import serve_mcp
    options = settings["config"].mcp
    return serve_mcp(data_dir=settings["data_dir"], listen_url=settings["url"],
                     config=args.config, autostart=options.autostart,
                     start_timeout=options.start_timeout_secs)


def _service(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    from syncd import service
    from syncd.config import default_config_path
    platform = args.platform or service.default_platform()
    if args.action == "status":
        return service.status(platform)
    if args.action == "uninstall":
        return service.uninstall(platform)
    config = (args.config or default_config_path()).expanduser().absolute()
    daemon = settings["config"].daemon
    socket = None if daemon.unix_socket is None else daemon.unix_socket.absolute()
    paths = service.Paths(config=config, data_dir=Path(settings["data_dir"]).absolute(),
                          log_dir=Path.home() / "Library" / "Logs" / "syncd",
                          socket_dir=None if socket is None else socket.parent,
                          shutdown_secs=daemon.shutdown_timeout_secs)
    try:  # a path a unit cannot hold is refused before anything is written
        if args.print_only:
            sys.stdout.write(service.render(platform, paths))
            return EXIT_OK
        return service.install(platform, paths)
    except ValueError as exc:
        print(f"syncd: {exc}", file=sys.stderr)
        return EXIT_CONFIG


def _hook(args: argparse.Namespace) -> int:
    """``recall --hook``, when ``syncd.entry`` left the command line to argparse (``python -m
    syncd`` spelled another way, an abbreviation, an extra option): the same code."""
    from syncd.hook import run_hook
    return run_hook(args.config, args.data_dir)


def _open(client: Client, args: argparse.Namespace) -> int:
    """A one-time login URL for the web page (single use, valid for a minute)."""
    answer = client.call("POST", "/ui/login-codes", {})
    url = str(answer["url"])
    if args.json:
        print(json.dumps({"url": url, "expires_in": answer["expires_in"]}))
        return EXIT_OK
    print(url, flush=True)
    desktop = sys.platform == "darwin" or bool(
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    if desktop and not args.no_browser:
        import webbrowser
        if not webbrowser.open(url):
            print("syncd open: no browser could be started; open the URL above", file=sys.stderr)
    print(f"this link logs one browser in and works once, for {answer['expires_in']} s",
          file=sys.stderr)
    return EXIT_OK


def _status(client: Client, args: argparse.Namespace) -> int:
    status = client.call("GET", "/v1/agent/status")
    if args.json:
        print(json.dumps(status, indent=2))
        return EXIT_OK
    print(f"syncd {status['version']} at {client.url}")
    for line in status_lines(status):
        print(line)
    return EXIT_OK


def _recall(client: Client, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"query": args.query, "realms": args.realm, "tags": args.tags}
    if args.memory_type:
        body["memory_type"] = args.memory_type
    if args.limit is not None:
        body["limit"] = args.limit
    result = client.call("POST", "/v1/agent/memory/query", body)
    if args.json:
        print(json.dumps(result, indent=2))
        return EXIT_OK
    if not result["memories"]:
        print("syncd: no memories found", file=sys.stderr)
        return EXIT_OK
    if result.get("fallback"):
        print(f"syncd: nothing matches {args.query!r}; the most important recent memories "
              "instead (scores 0):", file=sys.stderr)
    elif result.get("matched") is False:
        print(f"syncd: no memory surely answers {args.query!r}; the nearest ones:",
              file=sys.stderr)
    print(result["context"], end="")
    return EXIT_OK


# local_store.records.MEMORY_TYPES, spelled out: importing local_store costs ~0.3 s of start-up,
# which the prompt hook pays on every prompt (a test keeps the two equal).
SAVE_TYPES = ("fact", "decision", "preference", "learning", "summary", "procedure", "entity")


def _save(client: Client, args: argparse.Namespace) -> int:
    content = sys.stdin.read() if args.content == "-" else args.content
    body = {"content": content, "title": args.title, "memory_type": args.memory_type,
            "tags": args.tags, "realm": args.realm, "topic_key": args.topic_key,
            "importance": args.importance}
    result = client.call("POST", "/v1/agent/memory/tools/save_memory",
                         {k: v for k, v in body.items() if v is not None})
    verb = "updated" if result.get("upserted") else "exists" if result.get("deduped") else "saved"
    print(json.dumps(result) if args.json else f"{verb} {result['node_id']}")
    for note in (result.get("coerced") or {}).values():
        print(f"syncd: note: {note}", file=sys.stderr)
    return EXIT_OK


def _backup(data_dir: Path, dest: Path, as_json: bool = False) -> int:
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


def _restore(data_dir: Path, source: Path, as_json: bool = False) -> int:
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
              "set up another machine, let it sync from the control plane instead.", file=sys.stderr)
    return EXIT_OK


def _setup(args: argparse.Namespace) -> int:
    from syncd import setup
    command, extra = setup.syncd_command(), setup.global_args(args.config, args.data_dir)
    if args.agent == "mcp":
        print(json.dumps({"mcpServers": {setup.SERVER_NAME: setup.server_entry(command, extra)}},
                         indent=2))
        return EXIT_OK
    try:
        changes = setup.claude_code(args.settings.expanduser(), args.mcp_config.expanduser(),
                                    command=command, args=extra, uninstall=args.uninstall)
    except setup.SetupError as exc:
        print(f"syncd: {exc}", file=sys.stderr)
        return EXIT_FAILED
    for change in changes:
        if args.dry_run:
            print(f"--- {change.path}" + ("" if change.changed else " (unchanged)"))
            print(change.text, end="")
        elif not change.changed:
            print(f"unchanged {change.path}")
        else:
            setup.write(change)
            kept = "" if change.before is None else \
                f" (the previous one is {change.path}{setup.BACKUP_SUFFIX})"
            print(f"{'created' if change.before is None else 'updated'} {change.path}{kept}")
    return EXIT_OK


def _join(args: argparse.Namespace) -> int:
    """``syncd join``: rules in ``syncd/join.py``; the token is never printed."""
    from syncd.config import default_config_path
    from syncd.join import JoinError, join
    config = (args.config or default_config_path()).expanduser().absolute()
    invite = sys.stdin.readline() if args.invite == "-" else args.invite
    given = args.data_dir
    data_dir = None if given is None else given.expanduser().absolute()
    try:
        done = join(invite, config, data_dir, force=args.force)
    except JoinError as exc:
        print(f"syncd join: {exc.message}", file=sys.stderr)
        return {"usage": EXIT_CONFIG, "unreachable": EXIT_TEMPFAIL}.get(exc.kind, EXIT_FAILED)
    if args.json:
        print(json.dumps(done, indent=2))
        return EXIT_OK
    print(f"joined {done['hub']} as {done['name']!r} (role {done['role']}, plan "
          f"{done['plan']}: {', '.join(done['features']) or 'no paid features'})")
    print(f"  wrote the token to {done['token_file']} (0600; it is shown nowhere else)")
    print(f"  {'updated' if done['backup'] else 'created'} {done['config']}: "
          f"{', '.join(done['changed']) or 'nothing changed'}"
          + (f" (the previous one is {done['backup']})" if done['backup'] else ""))
    print(f"  pinned the hub's entitlement key {done['key_id']} ({done['public_key']})")
    print("  checked: the hub answered with an entitlement signed by that key")
    if done["daemon_running"]:
        print("next: restart the daemon, which reads its config only when it starts (`syncd "
              "stop`, then `syncd run`; a service manager starts it again by itself)")
    else:
        print("next: start the daemon (`syncd run`, or `syncd service install`)")
    return EXIT_OK


LIST_DEFAULT, LIST_MAX = 20, 200  # the store's own list cap is LIST_LIMIT_MAX


def _list(client: Client, args: argparse.Namespace) -> int:
    """One call per realm asked for (the route takes one), merged newest first."""
    if not 1 <= args.limit <= LIST_MAX:
        print(f"syncd: --limit must be from 1 to {LIST_MAX}, got {args.limit}", file=sys.stderr)
        return EXIT_CONFIG
    rows: list[dict[str, Any]] = []
    for realm in args.realm or [None]:
        body = {"realm": realm, "memory_type": args.memory_type, "tags": args.tags,
                "limit": args.limit}
        found = client.call("POST", "/v1/agent/memory/tools/list_memories",
                            {k: v for k, v in body.items() if v is not None})
        rows.extend(found["rows"])
    rows.sort(key=lambda row: (row.get("created_at") or "", row["id"]), reverse=True)
    rows = rows[:args.limit]
    if args.json:
        print(json.dumps({"memories": rows}, indent=2))
        return EXIT_OK
    if not rows:
        print("syncd: no memories match", file=sys.stderr)
    for row in rows:
        print(f"{row['id']}  {(row.get('created_at') or '')[:19]}  [{row['memory_type']}] "
              f"{row.get('realm') or ''}: {_headline(row)}")
    return EXIT_OK


def _headline(row: dict[str, Any]) -> str:
    """A memory in one line: its title, else the first line of its text."""
    text = row.get("title") or (row.get("content_preview") or "").strip().split("\n")[0]
    return text if len(text) <= 100 else text[:99] + "…"


def _get(client: Client, args: argparse.Namespace) -> int:
    memory = client.call("GET", "/v1/agent/memory/items/" + quote(args.memory_id, safe=":"))
    if args.json:
        print(json.dumps(memory, indent=2))
        return EXIT_OK
    print(f"{memory['id']}  [{memory['memory_type']}] {memory.get('realm') or ''}")
    facts = [("title", memory.get("title")), ("tags", ", ".join(memory.get("tags") or [])),
             ("importance", memory.get("importance")), ("status", memory.get("status")),
             ("valid", memory.get("valid_at")), ("invalidated", memory.get("invalid_at")),
             ("superseded by", memory.get("superseded_by")),
             ("updated", memory.get("updated_at"))]
    for name, value in facts:
        if value not in (None, ""):
            print(f"  {name + ':':<14} {value}")
    print()
    print(memory.get("content") or "")
    for edge in memory.get("edges") or []:
        other = edge["dst"] if edge["src"] == memory["id"] else edge["src"]
        arrow = "->" if edge["src"] == memory["id"] else "<-"
        print(f"  {arrow} {edge['type']} {other}")
    return EXIT_OK


def _edit(client: Client, args: argparse.Namespace) -> int:
    """Change the fields given; with none, the content, in the person's editor."""
    path = "/v1/agent/memory/items/" + quote(args.memory_id, safe=":")
    changes: dict[str, Any] = {}
    if args.title is not None:
        changes["title"] = args.title or None
    if args.tags is not None:
        changes["tags"] = args.tags
    if args.importance is not None:
        changes["importance"] = args.importance
    if not changes:
        memory = client.call("GET", path)
        text = _edited(str(memory.get("content") or ""), memory["id"])
        if text is None:
            return EXIT_FAILED
        if text == memory.get("content"):
            print(json.dumps({"ok": True, "memory_id": memory["id"], "changed": []})
                  if args.json else f"no change to {memory['id']}; nothing saved")
            return EXIT_OK
        changes["content"] = text
    result = client.call("PATCH", path, changes)
    for note in (result.get("coerced") or {}).values():
        print(f"syncd: note: {note}", file=sys.stderr)
    print(json.dumps(result) if args.json else
          f"edited {result['memory_id']} ({', '.join(result['changed'])})")
    return EXIT_OK


def _edited(text: str, memory_id: str) -> str | None:
    """``text`` as the person left it in ``$VISUAL``/``$EDITOR`` (vi without either); None,
    said on stderr, when the editor failed. One trailing line break, which editors add, is
    not part of it."""
    import subprocess
    import tempfile
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.TemporaryDirectory(prefix="syncd-edit-") as tmp:
        path = Path(tmp) / (memory_id.replace(":", "-") + ".md")
        path.write_text(text + "\n", encoding="utf-8")
        try:
            done = subprocess.run([*shlex.split(editor), str(path)], check=False)
        except OSError as exc:
            print(f"syncd edit: cannot run the editor {editor!r} ($VISUAL, $EDITOR): "
                  f"{exc.strerror or exc}; nothing saved", file=sys.stderr)
            return None
        if done.returncode != 0:
            print(f"syncd edit: the editor {editor!r} exited {done.returncode}; nothing saved",
                  file=sys.stderr)
            return None
        edited = path.read_text(encoding="utf-8")
    return edited[:-1] if edited.endswith("\n") else edited


def _history(client: Client, args: argparse.Namespace) -> int:
    """``syncd history ID``: the versions, or ``--restore N`` / ``--dismiss N`` one of them."""
    path = "/v1/agent/memory/items/" + quote(args.memory_id, safe=":") + "/versions"
    for action in ("restore", "dismiss"):
        number = getattr(args, action)
        if number is not None:
            result = client.call("POST", f"{path}/{number}/{action}")
            print(json.dumps(result, indent=2) if args.json else
                  f"{action}d version {number} of {result['memory_id']}"
                  + (" (a new edit: it syncs)" if action == "restore" else ""))
            return EXIT_OK
    body = client.call("GET", path)
    if args.json:
        print(json.dumps(body, indent=2))
        return EXIT_OK
    versions = body["versions"]
    open_conflicts = sum(1 for v in versions if v["reason"] == "conflict" and not v["reviewed"])
    print(f"{body['memory_id']}  {len(versions)} version{'s' * (len(versions) != 1)}"
          + (f", {open_conflicts} conflict(s) to review" if open_conflicts else ""))
    for version in versions:
        print(_version_line(version))
        print(f"      {_first_line(version['content'] or '')}")
    if open_conflicts:
        print("\nkeep a conflict with `syncd history ID --restore N`, or drop it with "
              "`--dismiss N`")
    return EXIT_OK


def _first_line(text: str) -> str:
    line = text.strip().split("\n")[0]
    return line if len(line) <= 100 else line[:99] + "…"


def _version_line(version: dict[str, Any]) -> str:
    name = "current" if version["n"] is None else f"#{version['n']}"
    reason = version["reason"] + (" (reviewed)" if version.get("reviewed") else "")
    if version.get("deleted"):
        reason += ", deleted"
    return (f"  {name:<8} {reason:<20} {(version['updated_at'] or '')[:19]}  "
            f"importance {version['importance']}  {version['status']}  "
            f"from {(version['origin'] or 'the plane')[:8]}")


def _delete(client: Client, args: argparse.Namespace) -> int:
    path = "/v1/agent/memory/items/" + quote(args.memory_id, safe=":")
    result = client.call("DELETE", path + ("?hard=true" if args.hard else ""))
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.hard:
        print(f"purged {result['memory_id']} (its text is gone from this store; the deletion "
              "syncs)")
    else:
        print(f"deleted {result['memory_id']} (hidden and synced as deleted; `--hard` purges "
              "its text)")
    return EXIT_OK


STOP_WAIT_SECS = 60.0  # the daemon's drain (shutdown_timeout) and its store's close


def _stop(client: Client, args: argparse.Namespace) -> int:
    """Ask the daemon to stop, then wait until it no longer answers."""
    try:
        client.call("POST", "/v1/agent/shutdown")
    except DaemonDown:
        report = {"stopped": False, "url": client.url, "running": False}
        print(json.dumps(report) if args.json else
              f"syncd: no daemon answers at {client.url}; nothing to stop", file=sys.stdout
              if args.json else sys.stderr)
        return EXIT_OK
    deadline = time.monotonic() + STOP_WAIT_SECS
    while _answers(client):  # it drains in-flight requests, then closes the store
        if time.monotonic() > deadline:
            print(f"syncd: the daemon at {client.url} still answers {STOP_WAIT_SECS:.0f} s "
                  "after it was asked to stop", file=sys.stderr)
            return EXIT_TEMPFAIL
        time.sleep(0.1)
    print(json.dumps({"stopped": True, "url": client.url, "running": False}) if args.json
          else f"syncd: stopped the daemon at {client.url}")
    return EXIT_OK


def _answers(client: Client) -> bool:
    """Is anything still listening at the daemon's address (a 503 while it drains counts)?"""
    try:
        client.call("GET", "/healthz")
    except DaemonDown:
        return False
    except ClientError:
        return True
    return True


COMMANDS = {"status": _status, "recall": _recall, "save": _save, "stop": _stop,
            "list": _list, "get": _get, "history": _history, "delete": _delete, "edit": _edit,
            "export": _export, "sync": _sync, "open": _open}  # and import, with its limit


if __name__ == "__main__":
    sys.exit(main())
