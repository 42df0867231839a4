"""``syncd demo``: a hub and two laptops in one process on loopback — write on one laptop,
recall on the other, and prove a ``<private>`` secret never left the first.

What it shows, one numbered step each, every claim checked (exit 1 names the first that fails):
  1. A hub (the reference control plane) and laptops A and B start on ``127.0.0.1`` port 0 in
     temporary directories. Each laptop is a real daemon app with its sync schedule (every 1 s);
     all three stores share one all-MiniLM-L6-v2 embedder, so the hub's model is the laptops'
     and vectors travel unchanged.
  2. A saves memories through its HTTP API: a fact, a procedure holding a ``<private>`` secret,
     and a decision that a newer decision supersedes (``memory_judge``).
  3. A syncs, then B syncs (``POST /v1/agent/sync/run``).
  4. B recalls them with A's vectors; ordinary recall hides the superseded decision, and asking
     for invalidated memories shows it marked ``superseded_by`` the new one.
  5. The secret is absent from the hub's full export and from A's own files: the redactor runs
     before anything is written, so it never reached A's disk either.
  6. The schedule alone: A saves once more and B recalls it without a manual sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from local_store import Store
from local_store.embed_minilm import EmbedderUnavailable, MiniLMEmbedder
from syncd.config import (
    ControlPlaneConfig,
    DaemonConfig,
    EntitlementConfig,
    HubConfig,
    SyncConfig,
)
from syncd.entitlement.keeper import attach_gate
from syncd.entitlement.token import key_id, pin, public_key_text
from syncd.http import create_app
from syncd.hub.app import create_hub_app
from syncd.hub.keys import load_or_create_key
from syncd.hub.tokens import TokenBook, create_token
from syncd.sync.engine import SyncOptions
from syncd.sync.runner import SyncRunner

SECRET = "sk-demo-123"
INTERVAL_SECS = 1.0
SCHEDULE_WAIT_SECS = 15.0
SAVE = "/v1/agent/memory/tools/{}"
QUERY = "/v1/agent/memory/query"
FACT = {"content": "The billing service keeps invoices in Postgres 16 on the eu-west-1 cluster.",
        "title": "Billing database", "memory_type": "fact", "tags": ["billing"]}
DEPLOY = {"content": "Deploy to staging with `make deploy ENV=staging`; the deploy key is "
          f"<private>{SECRET}</private>.", "title": "Staging deploy", "memory_type": "procedure"}
DECISION_V1 = {"content": "Decision: laptops poll the control plane every 5 minutes.",
               "title": "Sync interval", "memory_type": "decision"}
DECISION_V2 = {"content": "Decision: laptops poll the control plane every 30 seconds; "
               "5 minutes left teammates with stale memories.", "title": "Sync interval",
               "memory_type": "decision"}
LATE = {"content": "The release checklist lives in docs/RELEASE.md.", "memory_type": "fact"}


class DemoFailed(Exception):
    pass


def check(ok: bool, claim: str) -> None:
    if not ok:
        raise DemoFailed(claim)


def say(text: str = "") -> None:
    print(text, flush=True)


@dataclass
class Node:
    """One served app (the hub or a laptop daemon) and the bearer token it wants."""

    name: str
    url: str
    token: str
    store: Store


async def serve(stack: contextlib.AsyncExitStack, name: str, store: Store,
                app: web.Application, token: str, sync: SyncRunner | None = None) -> Node:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    if sync is not None:
        await sync.start()
        stack.push_async_callback(sync.stop)
    return Node(name, f"http://127.0.0.1:{runner.addresses[0][1]}", token, store)


class Client:
    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def raw(self, node: Node, method: str, path: str, body: Any = None) -> bytes:
        headers = {"Authorization": f"Bearer {node.token}"}
        async with self.session.request(method, node.url + path, json=body,
                                        headers=headers) as resp:
            data = await resp.read()
        check(resp.status == 200, f"{method} {path} on {node.name}: HTTP {resp.status}: "
              f"{data[:300].decode(errors='replace')}")
        return data

    async def call(self, node: Node, method: str, path: str, body: Any = None) -> Any:
        return json.loads(await self.raw(node, method, path, body))

    async def tool(self, node: Node, name: str, args: dict[str, Any]) -> Any:
        return await self.call(node, "POST", SAVE.format(name), args)

    async def recall(self, node: Node, query: str, **extra: Any) -> list[dict[str, Any]]:
        answer = await self.call(node, "POST", QUERY, {"query": query, **extra})
        return [m for m in answer["memories"] if not m["fallback"]]


async def run_demo() -> int:
    """Run the walk-through; 0 when every check held, 1 (with the reason) otherwise."""
    try:
        async with contextlib.AsyncExitStack() as stack:
            tmp = await asyncio.to_thread(tempfile.TemporaryDirectory, prefix="syncd-demo-")
            stack.push_async_callback(asyncio.to_thread, tmp.cleanup)
            await walk_through(stack, Path(tmp.name))
    except (DemoFailed, EmbedderUnavailable) as exc:
        print(f"demo FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    say("\nDone: every check held.")
    return 0


async def start(stack: contextlib.AsyncExitStack, root: Path) -> tuple[Node, Node, Node]:
    embedder = MiniLMEmbedder()
    began = time.perf_counter()
    await asyncio.to_thread(embedder.load)
    model = embedder.model_id
    say(f"   embedder  {model}, loaded in {time.perf_counter() - began:.1f} s, one instance "
        "shared by the three stores")
    hub_store = await Store.open(root / "hub", embedder=embedder, feed=True)
    stack.push_async_callback(hub_store.close)
    write = await asyncio.to_thread(create_token, root / "hub", role="write", name="laptops")
    read = await asyncio.to_thread(create_token, root / "hub", role="read", name="auditor")
    book = await asyncio.to_thread(TokenBook, root / "hub")
    key = await asyncio.to_thread(load_or_create_key, root / "hub")
    # the hub's defaults, as `syncd hub` with no [hub] section
    hub = await serve(stack, "hub", hub_store, create_hub_app(
        hub_store, book, config=HubConfig(), signing_key=key), read)
    say(f"   hub       {hub.url}  reference control plane, model {model}")
    pinned = pin([public_key_text(key.public_key())])
    say(f"   pinned    the hub's entitlement key {key_id(key.public_key())} "
        "([entitlement] public_keys): sync and graph recall are paid features")
    # each laptop: the defaults of `syncd run`, but a plane of the embedder's model, every 1 s
    daemon, plane = DaemonConfig(), ControlPlaneConfig(embedding_model=model)
    schedule = SyncConfig(interval_secs=INTERVAL_SECS)
    laptops = []
    for name in ("A", "B"):
        store = await Store.open(root / name, embedder=embedder)
        stack.push_async_callback(store.close)
        sync = SyncRunner.create(store, url=hub.url, token=write,
                                 options=SyncOptions.from_config(plane, schedule),
                                 interval=schedule.interval_secs, jitter=schedule.jitter)
        token = secrets.token_urlsafe(24)
        keeper = attach_gate(store, sync, root / name, pinned, EntitlementConfig())
        await keeper.start()
        stack.push_async_callback(keeper.stop)
        await keeper.check()  # fetch a signed entitlement for this device from the hub now
        gate = keeper.status()
        check(gate["entitled"] and gate["sync"] == "on" and gate["graph"] == "on",
              f"laptop {name} is not entitled: {gate['reason']}")
        laptop = await serve(stack, f"laptop {name}", store, create_app(
            store, token=token, extra_hosts=daemon.allowed_hosts, max_body=daemon.max_body_bytes,
            plane_model=plane.embedding_model, sync=sync, keeper=keeper), token, sync)
        say(f"   laptop {name}  {laptop.url}  daemon API; syncs with the hub every "
            f"{INTERVAL_SECS:.0f} s")
        say(f"             gate on: plan {gate['plan']}, sync {gate['sync']}, graph "
            f"{gate['graph']}, signed for device {store.replica_id}, valid "
            f"{(gate['exp'] - time.time()) / 86400:.0f} days offline")
        laptops.append(laptop)
    return hub, laptops[0], laptops[1]


async def walk_through(stack: contextlib.AsyncExitStack, root: Path) -> None:
    say("syncd demo: a hub and two laptops on 127.0.0.1, in one process, in temporary dirs")
    say("\n1. Start the hub and laptops A and B")
    hub, a, b = await start(stack, root)
    api = Client(await stack.enter_async_context(aiohttp.ClientSession()))

    say("\n2. A saves memories over its HTTP API (POST /v1/agent/memory/tools/save_memory)")
    fact = await api.tool(a, "save_memory", FACT)
    say(f"   fact       {FACT['content']}")
    deploy = await api.tool(a, "save_memory", DEPLOY)
    stored = (await api.tool(a, "get_memory", {"memory_id": deploy["id"]}))["content"]
    say(f"   procedure  sent:   {DEPLOY['content']}")
    say(f"              stored: {stored}")
    check("[redacted]" in stored and SECRET not in stored, "A stored the deploy key unredacted")
    say("              (the <private> span is replaced before validation, embedding and the write)")
    old = await api.tool(a, "save_memory", DECISION_V1)
    new = await api.tool(a, "save_memory", DECISION_V2)
    say(f"   decision   v1: {DECISION_V1['content']}")
    say(f"   decision   v2: {DECISION_V2['content']}")
    await api.tool(a, "memory_judge", {"memory_id": new["id"], "target_id": old["id"],
                                       "verdict": "supersedes", "reason": "interval changed"})
    judged = await api.tool(a, "get_memory", {"memory_id": old["id"]})
    check(judged["superseded_by"] == new["node_id"], "v1 is not marked superseded by v2")
    say("   judge      v2 supersedes v1 (memory_judge): v1 gets invalid_at and superseded_by,")
    say("              plus an INVALIDATES edge v2 -> v1; nothing is deleted")

    say("\n3. Sync through the hub (POST /v1/agent/sync/run; the 1 s schedule runs too)")
    for laptop in (a, b):
        report = await api.call(laptop, "POST", "/v1/agent/sync/run")
        check(report["ok"], f"{laptop.name}'s sync pass failed: {report['error']}")
        say(f"   {laptop.name}: pushed {report['pushed_nodes']} memories and "
            f"{report['pushed_edges']} edges, pulled {report['pulled_nodes']} and "
            f"{report['pulled_edges']}; {report['requests']} requests, "
            f"{report['bytes_out'] / 1024:.1f} KiB out, {report['bytes_in'] / 1024:.1f} KiB in, "
            f"{report['took_ms']:.0f} ms")
    status = await api.call(a, "GET", "/v1/agent/sync/status")
    check(status["outbox"] == 0, f"A's outbox still holds {status['outbox']} items")
    say("   A's outbox is empty: the hub acknowledged every version")
    other = await api.call(b, "GET", "/v1/agent/sync/status")
    say(f"   since start (scheduled passes included): A pushed "
        f"{status['totals'].get('pushed_nodes', 0)} memory versions in {status['passes']} "
        f"passes, B pulled {other['totals'].get('pulled_nodes', 0)} in {other['passes']}")

    await recall_on_b(api, b, fact, deploy, old, new)
    await secret_stayed_home(api, hub, a)

    say("\n6. The schedule alone: A saves one more memory; nobody calls sync/run")
    late = await api.tool(a, "save_memory", LATE)
    began = time.perf_counter()
    while not any(m["id"] == late["node_id"] for m in await api.recall(b, LATE["content"])):
        check(time.perf_counter() - began < SCHEDULE_WAIT_SECS,
              f"B did not recall A's new memory within {SCHEDULE_WAIT_SECS:.0f} s")
        await asyncio.sleep(0.05)
    say(f"   B recalled it {time.perf_counter() - began:.1f} s after A saved it "
        "(A pushes a save at once; B's long-poll on the hub answers when it commits)")
    say("   B recalled the scheduled memory: yes")


async def recall_on_b(api: Client, b: Node, fact: dict[str, Any], deploy: dict[str, Any],
                      old: dict[str, Any], new: dict[str, Any]) -> None:
    say("\n4. B recalls (POST /v1/agent/memory/query on B)")
    for question, wanted, label in (
            ("Which database holds the billing invoices?", fact, "fact"),
            ("How do I deploy to staging?", deploy, "procedure")):
        hits = await api.recall(b, question)
        check(bool(hits) and hits[0]["id"] == wanted["node_id"],
              f"B's top hit for {question!r} is not A's {label}")
        say(f"   {question!r}")
        say(f"     top hit: {hits[0]['content_preview']}  (score {hits[0]['score']:.2f})")
        say(f"   B recalled the {label} from A: yes")
    question = "How often do laptops poll the control plane?"
    answer = await api.call(b, "POST", QUERY, {"query": question})
    ids = [m["id"] for m in answer["memories"]]
    check(new["node_id"] in ids and old["node_id"] not in ids,
          "B's recall does not show v2 alone (v1 is superseded)")
    say(f"   {question!r}: v2 is recalled, superseded v1 is filtered out")
    say("   context handed to the agent:")
    for line in answer["context"].strip().splitlines():
        say(f"     | {line if len(line) <= 100 else line[:99] + '…'}")
    hits = await api.recall(b, question, include_invalidated=True)
    marked = [m for m in hits if m["id"] == old["node_id"]]
    check(bool(marked) and marked[0]["superseded_by"] == new["node_id"],
          "with include_invalidated, v1 is not shown superseded by v2")
    say(f"   with include_invalidated=true, v1 comes back marked: invalid_at "
        f"{marked[0]['invalid_at']}, superseded_by v2")
    stats = await api.call(b, "GET", "/v1/agent/status")
    check(stats["indexed_vectors"] == stats["memories"] == 4,
          f"B holds {stats['memories']} memories and {stats['indexed_vectors']} vectors, not 4")
    say(f"   B holds {stats['memories']} memories and {stats['indexed_vectors']} "
        f"{stats['embedder']} vectors, all pulled from the hub (B re-embedded nothing)")


async def secret_stayed_home(api: Client, hub: Node, a: Node) -> None:
    say("\n5. The secret never left A")
    export = await api.raw(hub, "GET", "/v1/agent/memory/export")
    found = SECRET.encode() in export
    say(f"   hub export (GET /v1/agent/memory/export, read token): {len(export) / 1024:.1f} KiB,"
        f" {len(json.loads(export)['memory_nodes'])} memories, '{SECRET}' found: "
        f"{'yes' if found else 'no'}, '[redacted]' found: "
        f"{'yes' if b'[redacted]' in export else 'no'}")
    check(not found, "the hub's export holds the secret")
    check(b"[redacted]" in export, "the redacted deploy procedure is missing from the hub")
    say("   secret absent from the hub: yes")
    files = await asyncio.to_thread(lambda: {p.name: p.read_bytes()
                                             for p in a.store.data_dir.iterdir() if p.is_file()})
    leaked = sorted(name for name, data in files.items() if SECRET.encode() in data)
    check(not leaked, f"A's files hold the secret: {', '.join(leaked)}")
    say(f"   A's own files ({', '.join(sorted(files))}): '{SECRET}' found in none")
    say("   secret absent from A's disk: yes (redacted at save time, before any write)")
