"""The commands on one memory at a time, through the daemon's API: ``save``, ``recall``,
``list``, ``get``, ``edit``, ``history`` and ``delete``."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

from syncd.client import Client
from syncd.commands.parser import LIST_MAX
from syncd.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_OK


def save_command(client: Client, args: argparse.Namespace) -> int:
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


def recall_command(client: Client, args: argparse.Namespace) -> int:
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


def list_command(client: Client, args: argparse.Namespace) -> int:
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


def get_command(client: Client, args: argparse.Namespace) -> int:
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


def edit_command(client: Client, args: argparse.Namespace) -> int:
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


def history_command(client: Client, args: argparse.Namespace) -> int:
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


def delete_command(client: Client, args: argparse.Namespace) -> int:
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
