"""The commands that run, stop and ask the daemon: ``run``, ``stop``, ``status``, ``sync``,
``open`` and ``mcp`` (and what ``run`` builds: the sync runner and the entitlement set-up)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import replace
from typing import Any

from syncd.client import Client, ClientError, DaemonDown
from syncd.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_TEMPFAIL
from syncd.report import pass_summary, status_lines


def run_command(args: argparse.Namespace, settings: dict[str, Any]) -> int:
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
            sync=sync_factory(config), entitlement=entitlement_setup(config),
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


def sync_factory(config: Any) -> Any:
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
                                           plane_embedder=plane_embedder(config))


def plane_embedder(config: Any) -> Any:
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


def entitlement_setup(config: Any) -> Any:
    from syncd.daemon import EntitlementSetup, StartupError
    from syncd.entitlement.token import pin
    try:
        pinned = pin(config.entitlement.public_keys)
    except ValueError as exc:
        raise StartupError(str(exc), EXIT_CONFIG) from None
    return EntitlementSetup(pinned=pinned, license_file=config.entitlement.license_file,
                            refresh_secs=config.entitlement.refresh_secs)


def sync_command(client: Client, args: argparse.Namespace) -> int:
    report = replace(client, timeout=args.timeout).call("POST", "/v1/agent/sync/run", {})
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for line in pass_summary(report):
            print(line)
    return EXIT_OK if report.get("ok") else EXIT_FAILED


def mcp_command(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    """Lists the tools at once, daemon or not; a tool call starts the daemon when none answers
    (``[mcp] autostart``) and waits for it (syncd/autostart.py)."""
    from syncd.mcp_stdio import serve_mcp
    options = settings["config"].mcp
    return serve_mcp(data_dir=settings["data_dir"], listen_url=settings["url"],
                     config=args.config, autostart=options.autostart,
                     start_timeout=options.start_timeout_secs)


def open_command(client: Client, args: argparse.Namespace) -> int:
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


def status_command(client: Client, args: argparse.Namespace) -> int:
    status = client.call("GET", "/v1/agent/status")
    if args.json:
        print(json.dumps(status, indent=2))
        return EXIT_OK
    print(f"syncd {status['version']} at {client.url}")
    for line in status_lines(status):
        print(line)
    return EXIT_OK


STOP_WAIT_SECS = 60.0  # the daemon's drain (shutdown_timeout) and its store's close


def stop_command(client: Client, args: argparse.Namespace) -> int:
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
