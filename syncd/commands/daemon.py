"""The commands that run, stop and ask the daemon: ``run``, ``stop``, ``status``, ``sync``,
``open`` and ``mcp``."""

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
from syncd.exits import EXIT_FAILED, EXIT_OK, EXIT_TEMPFAIL
from syncd.report import pass_summary, status_lines


def run_command(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    import asyncio

    from syncd.daemon import Daemon, StartupError, make_embedder
    config = settings["config"]  # --allow-non-loopback is in it already (command_settings)
    try:
        embedder = make_embedder(config.embedding, idle_unload=True)
        daemon = Daemon(config, data_dir=settings["data_dir"], host=settings["host"],
                        port=settings["port"], embedder=embedder)
        return asyncio.run(daemon.run(ready=lambda url: print(f"syncd: ready on {url}",
                                                              file=sys.stderr, flush=True)))
    except StartupError as exc:
        print(f"syncd: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # anything else at start-up is reported, not a traceback dump
        logging.getLogger("syncd").exception("daemon failed")
        print(f"syncd: {exc}", file=sys.stderr)
        return EXIT_TEMPFAIL


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
