"""Proxies. The loopback clients (the CLI, the prompt hook, ``syncd mcp``) never use one,
whatever the environment says: a proxy would be sent the API token and the prompt. The sync
client uses the one ``control_plane.proxy`` or the environment names, as curl and pip do.

Against a real recording proxy on loopback (tests/syncd/forwardproxy.py), real daemon
processes and a real hub; no mocks. The plane is called ``plane.test``, a name that resolves
nowhere (RFC 2606): only a proxy told where it is can reach it, so a pass that succeeds went
through the proxy. (A loopback plane never goes through an environment proxy: that rule is
syncd's, tested in tests/sync/test_plane_proxy.py.)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import json
import logging
import signal
import socket
import ssl
import sys
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from local_store import HashingEmbedder, Store
from syncd.config import ConfigError, parse_config
from syncd.entitlement.token import public_key_text
from syncd.hub.app import create_hub_app
from syncd.hub.keys import load_or_create_key
from syncd.hub.tokens import TokenBook, create_token
from syncd.sync.engine import PassReport, SyncEngine, SyncOptions
from syncd.sync.plane import PlaneClient
from tests.sync.harness import MODEL, live_contents
from tests.syncd.forwardproxy import ForwardProxy
from tests.syncd.processes import env_for, finish, wait_ready
from tests.syncd.tlscerts import make_server_cert

PLANE = "plane.test"
NOTE = "rotate the staging keys monthly"
_NAMES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
PROXY_VARIABLES = frozenset({*_NAMES, *(name.upper() for name in _NAMES)})


def environment(home: Path, **variables: str) -> dict[str, str]:
    """``env_for(home)`` without this machine's proxy variables, plus ``variables``."""
    env = {k: v for k, v in env_for(home).items() if k not in PROXY_VARIABLES}
    return {**env, **variables}


def every_proxy_variable(url: str) -> dict[str, str]:
    """A laptop behind a proxy: every proxy variable names it, and no_proxy is unset."""
    return {v: url for name in _NAMES[:3] for v in (name, name.upper())}


async def syncd(env: dict[str, str], *args: str,
                stdin: bytes | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "syncd", *args, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):
        out, err = await proc.communicate(stdin)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@contextlib.asynccontextmanager
async def running_daemon(env: dict[str, str], *args: str) -> AsyncIterator[None]:
    """``syncd ARGS run`` on a free loopback port, ready; stopped (exit 0) after."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "syncd", *args, "run", "--listen", "127.0.0.1:0", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        await wait_ready(proc)
        yield
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code, err = await finish(proc)
    assert code == 0, err


@dataclass
class Plane:
    store: Store
    port: int
    token: str
    public_key: str


@contextlib.asynccontextmanager
async def serving_hub(data_dir: Path, host: str = "127.0.0.1",
                      tls: ssl.SSLContext | None = None) -> AsyncIterator[Plane]:
    """A real hub (with an entitlement signing key) on ``host``, a free port."""
    store = await Store.open(data_dir, embedder=HashingEmbedder(), feed=True)
    token = await asyncio.to_thread(create_token, data_dir, role="write", name="laptops")
    book = await asyncio.to_thread(TokenBook, data_dir)
    key = await asyncio.to_thread(load_or_create_key, data_dir)
    runner = web.AppRunner(create_hub_app(store, book, signing_key=key))
    await runner.setup()
    try:
        await web.TCPSite(runner, host, 0, ssl_context=tls).start()
        yield Plane(store, runner.addresses[0][1], token, public_key_text(key.public_key()))
    finally:
        await runner.cleanup()
        await store.close()


async def one_pass(data_dir: Path, client: PlaneClient) -> PassReport:
    """A laptop with one memory runs one sync pass with ``client``."""
    store = await Store.open(data_dir, embedder=HashingEmbedder())
    engine = SyncEngine(store, client, SyncOptions(plane_model=MODEL))
    try:
        await engine.start()
        await store.memories.save({"content": NOTE, "type": "procedure"})
        return await engine.run_pass("test")
    finally:
        await engine.close()
        await store.close()


async def holds_note(plane: Plane) -> bool:
    return any(row[0] == NOTE for row in (await live_contents(plane.store)).values())


def mcp_messages() -> bytes:
    messages = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                            "clientInfo": {"name": "t", "version": "0"}}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]
    return b"".join(json.dumps(m).encode() + b"\n" for m in messages)


# --- the loopback clients never use a proxy -----------------------------------------------------

async def test_the_cli_and_the_prompt_hook_never_go_through_a_proxy(tmp_path: Path) -> None:
    """status, save, recall, recall --hook and export (the streamed download) all reach the
    daemon while every proxy variable names a proxy and no_proxy is unset; the proxy sees not
    one connection (it saw the token and the prompt before)."""
    async with ForwardProxy() as proxy:
        env = environment(tmp_path, **every_proxy_variable(proxy.url))
        data = ["--data-dir", str(tmp_path / "data")]
        async with running_daemon(env, *data):
            code, out, err = await syncd(env, *data, "save", NOTE, "--type", "procedure")
            assert code == 0 and out.startswith("saved "), err
            code, out, err = await syncd(env, *data, "recall", "staging keys")
            assert code == 0 and NOTE in out, err
            prompt = {"prompt": "how often do we rotate the staging keys?", "cwd": str(tmp_path)}
            code, out, err = await syncd(env, *data, "recall", "--hook",
                                         stdin=json.dumps(prompt).encode())
            assert code == 0, err
            assert NOTE in json.loads(out)["hookSpecificOutput"]["additionalContext"], out
            code, out, err = await syncd(env, *data, "status")
            assert code == 0 and "memories         1" in out, err + out
            code, _, err = await syncd(env, *data, "export", "-o", str(tmp_path / "out.json"))
            assert code == 0 and NOTE in (tmp_path / "out.json").read_text(), err
        assert (proxy.connections, proxy.requests) == (0, [])


async def test_the_mcp_bridge_never_goes_through_a_proxy(tmp_path: Path) -> None:
    async with ForwardProxy() as proxy:
        env = environment(tmp_path, **every_proxy_variable(proxy.url))
        data = ["--data-dir", str(tmp_path / "data")]
        async with running_daemon(env, *data):
            code, out, err = await syncd(env, *data, "mcp", stdin=mcp_messages())
        answers = [json.loads(line) for line in out.splitlines()]
        assert code == 0 and [a["id"] for a in answers] == [1, 2], (out, err)
        assert answers[1]["result"]["tools"], out
        assert (proxy.connections, proxy.requests) == (0, [])


async def test_that_environment_sends_the_stdlib_default_client_to_the_proxy(
        tmp_path: Path) -> None:
    """The control: with the environment above, ``urllib.request.urlopen`` (what the CLI used)
    hands a loopback request, its bearer token included, to the proxy — so the zero
    connections above are the fix, not a proxy the clients could not have found."""
    async with ForwardProxy() as proxy:
        env = environment(tmp_path, **every_proxy_variable(proxy.url))
        code = ("import sys, urllib.request as r\n"
                "try: r.urlopen(r.Request(sys.argv[1], headers={'Authorization': 'Bearer t0k'}))\n"
                "except OSError: pass\n")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, "http://127.0.0.1:9/v1/agent/status", env=env)
        async with asyncio.timeout(60):
            await proc.wait()
        assert [(r.target, r.headers.get("authorization")) for r in proxy.requests] == [
            ("http://127.0.0.1:9/v1/agent/status", "Bearer t0k")]


# --- the sync client uses the proxy it is given -------------------------------------------------

def server_tls(directory: Path, host: str) -> tuple[ssl.SSLContext, Path]:
    """A TLS context for a server named ``host``, and the CA file a client must trust."""
    certs = make_server_cert(directory, host)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.cert, certs.key)
    return context, certs.ca


async def test_a_daemon_syncs_with_an_https_plane_through_the_proxy_its_environment_names(
        tmp_path: Path) -> None:
    """`syncd run` with HTTPS_PROXY (and every other proxy variable) set and an https:// plane:
    the sync pass and the entitlement check go through a CONNECT tunnel (TLS end to end,
    the certificate checked against the CA in SSL_CERT_FILE); the CLI's own calls do not."""
    tls, ca = await asyncio.to_thread(server_tls, tmp_path, PLANE)
    async with serving_hub(tmp_path / "hub", tls=tls) as plane, \
            ForwardProxy(hosts={PLANE: "127.0.0.1"}) as proxy:
        (tmp_path / "plane-token").write_text(plane.token)
        config = tmp_path / "syncd.toml"
        config.write_text(f'[control_plane]\nurl = "https://{PLANE}:{plane.port}"\n'
                          f'token_file = "{tmp_path / "plane-token"}"\n'
                          f'embedding_model = "{MODEL}"\n[sync]\ninterval_secs = 3600\n'
                          f'[entitlement]\npublic_keys = ["{plane.public_key}"]\n')
        env = environment(tmp_path, **every_proxy_variable(proxy.url), SSL_CERT_FILE=str(ca))
        args = ["--config", str(config), "--data-dir", str(tmp_path / "data")]
        async with running_daemon(env, *args):
            code, _, err = await syncd(env, *args, "save", NOTE, "--type", "procedure")
            assert code == 0, err
            code, out, err = await syncd(env, *args, "sync", "--json")
            assert code == 0 and json.loads(out)["ok"], err + out
            code, out, err = await syncd(env, *args, "status", "--json")
            assert json.loads(out)["entitlement"]["source"] == "online", out
        assert await holds_note(plane)
        assert {(r.method, r.target) for r in proxy.requests} == {
            ("CONNECT", f"{PLANE}:{plane.port}")}
        # the plane's token stays inside the tunnel (aiohttp put a session's Authorization
        # into the CONNECT's Proxy-Authorization)
        assert not any(plane.token in value for r in proxy.requests for value in r.headers.values())


@pytest.mark.parametrize("variables", [
    {"HTTP_PROXY": "{proxy}"},
    {"http_proxy": "{proxy}", "NO_PROXY": "other.test, .example.com, 10.0.0.0/8"},
    {"http_proxy": "{bare}"},  # host:port, no scheme: http:// as curl and pip take it
    {"ALL_PROXY": "{proxy}"},
    {"http_proxy": "{proxy}", "HTTPS_PROXY": "http://127.0.0.1:9"},  # for https:// planes
], ids=["HTTP_PROXY", "no_proxy-not-matching", "no-scheme", "ALL_PROXY", "by-scheme"])
async def test_the_sync_client_reaches_an_http_plane_through_the_environments_proxy(
        tmp_path: Path, variables: dict[str, str]) -> None:
    async with serving_hub(tmp_path / "hub") as plane, \
            ForwardProxy(hosts={PLANE: "127.0.0.1"}) as proxy:
        env = {name: value.format(proxy=proxy.url, bare=proxy.url.removeprefix("http://"))
               for name, value in variables.items()}
        client = PlaneClient(f"http://{PLANE}:{plane.port}", plane.token, timeout=10, env=env)
        report = await one_pass(tmp_path / "laptop", client)
        assert report.ok, report.error
        assert await holds_note(plane)
        assert proxy.requests and all(
            r.target.startswith(f"http://{PLANE}:{plane.port}/v1/agent/memory/")
            and r.headers["authorization"] == f"Bearer {plane.token}" for r in proxy.requests)


def outward_address() -> str | None:
    """This machine's address on its default route (a UDP ``connect`` sends nothing), if it
    has one that is not loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if ipaddress.ip_address(address).is_loopback else address


@pytest.mark.parametrize(("no_proxy", "through"), [
    ("{ip}", False), ("{net}", False), ("*", False), ("elsewhere.test,{ip}:{port}", False),
    ("{ip}:1", True), ("elsewhere.test", True), ("", True)])
async def test_no_proxy_naming_the_plane_bypasses_the_proxy(
        tmp_path: Path, no_proxy: str, through: bool) -> None:
    """A plane on this machine's own network address (not loopback, which never goes through
    an environment proxy): NO_PROXY naming it — the address, a CIDR block holding it, ``*``,
    or address:port — sends the pass direct; naming something else leaves it proxied."""
    ip = outward_address()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address to serve a plane on")
    async with serving_hub(tmp_path / "hub", host=ip) as plane, ForwardProxy() as proxy:
        net = ipaddress.ip_network(f"{ip}/24", strict=False)
        env = {"HTTP_PROXY": proxy.url,
               "NO_PROXY": no_proxy.format(ip=ip, net=net, port=plane.port)}
        client = PlaneClient(f"http://{ip}:{plane.port}", plane.token, timeout=10, env=env)
        report = await one_pass(tmp_path / "laptop", client)
        assert report.ok, report.error
        assert await holds_note(plane)
        assert (proxy.connections > 0) is through, proxy.requests


@pytest.mark.parametrize(("where", "host"), [
    ("file", PLANE), ("environment", PLANE), ("file", "127.0.0.1")])
async def test_the_proxy_option_wins_over_the_environment(
        tmp_path: Path, where: str, host: str) -> None:
    """``[control_plane] proxy`` (or SYNCD_CONTROL_PLANE_PROXY) is used for every request: not
    the proxy HTTP_PROXY names, not bypassed by NO_PROXY, even for a loopback plane."""
    async with serving_hub(tmp_path / "hub") as plane, \
            ForwardProxy(hosts={PLANE: "127.0.0.1"}) as proxy, ForwardProxy() as decoy:
        url = f"http://{host}:{plane.port}"
        option = f'proxy = "{proxy.url}/"\n' if where == "file" else ""
        overrides = {"SYNCD_CONTROL_PLANE_PROXY": proxy.url} if where == "environment" else {}
        section = parse_config(f'[control_plane]\nurl = "{url}"\n{option}'.encode(),
                               env=overrides).control_plane
        assert section.proxy == proxy.url
        machine = {"HTTP_PROXY": decoy.url, "NO_PROXY": f"{PLANE},127.0.0.1"}
        client = PlaneClient(url, plane.token, timeout=10, proxy=section.proxy, env=machine)
        report = await one_pass(tmp_path / "laptop", client)
        assert report.ok, report.error
        assert proxy.requests and all(r.target.startswith(url) for r in proxy.requests)
        assert decoy.connections == 0


async def test_proxy_credentials_are_sent_to_the_proxy_and_never_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """user:password in the proxy URL (percent-encoded) become Proxy-Authorization; neither a
    refusal (407), nor a proxy that is down, nor any log line shows the password."""
    caplog.set_level(logging.DEBUG)
    user, password = "ada", "s3cr:et@pw"
    quoted = urllib.parse.quote(password, safe="")
    async with serving_hub(tmp_path / "hub") as plane, \
            ForwardProxy(hosts={PLANE: "127.0.0.1"}, credentials=(user, password)) as proxy:
        address = proxy.url.removeprefix("http://")
        url = f"http://{PLANE}:{plane.port}"
        good = PlaneClient(url, plane.token, timeout=10, proxy=f"http://{user}:{quoted}@{address}")
        assert password not in repr(good.proxy) and quoted not in repr(good.proxy)
        report = await one_pass(tmp_path / "a", good)
        assert report.ok, (report.error, proxy.requests)
        wanted = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        assert {r.headers.get("proxy-authorization") for r in proxy.requests} == {wanted}
        refused = await one_pass(tmp_path / "b", PlaneClient(
            url, plane.token, timeout=10, proxy=f"http://{user}:wrong-{quoted}@{address}"))
        assert not refused.ok and "407" in (refused.error or ""), refused.error
    down = await one_pass(tmp_path / "c", PlaneClient(
        url, plane.token, timeout=10, proxy=f"http://{user}:{quoted}@{address}"))
    assert not down.ok and f"through the proxy http://{address}" in (down.error or "")
    for text in (refused.error or "", down.error or "", caplog.text):
        assert password not in text and quoted not in text and "wrong-" not in text


# --- the option's validation --------------------------------------------------------------------

@pytest.mark.parametrize(("data", "env", "expected"), [
    ('proxy = "socks5://ada:s3cret@proxy:1080"', {},
     'control_plane.proxy = "socks5://ada:***@proxy:1080": must be an http:// or https:// URL'),
    ('proxy = "proxy.corp:3128"', {}, "e.g. http://proxy.example.com:3128"),
    ('proxy = "http://ada:s3cret@proxy:3128/path"', {},
     'control_plane.proxy = "http://ada:***@proxy:3128/path": must be scheme://host[:port]'),
    ('proxy = "http://proxy:99999"', {}, "control_plane.proxy = \"http://proxy:99999\": has an "
     "invalid port"),
    ('proxy = "http://"', {}, "has no host"),
    ("proxy = 3128", {}, "control_plane.proxy = 3128: expected a string"),
    ("", {"SYNCD_CONTROL_PLANE_PROXY": "ftp://ada:s3cret@proxy"},
     'control_plane.proxy = "ftp://ada:***@proxy": must be an http:// or https:// URL'),
])
def test_a_bad_proxy_is_a_config_error_naming_the_field_without_the_password(
        data: str, env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"[control_plane]\n{data}\n".encode(), source="/etc/syncd.toml", env=env)
    message = str(caught.value)
    assert expected in message and "s3cret" not in message, message
    assert caught.value.field == "control_plane.proxy"
    source = "environment SYNCD_CONTROL_PLANE_PROXY" if env else "/etc/syncd.toml"
    assert message.endswith(f"(from {source})"), message


def test_the_proxy_option_defaults_to_unset_and_an_empty_override_unsets_it() -> None:
    assert parse_config(b"").control_plane.proxy is None
    written = b'[control_plane]\nproxy = "https://ada:pw@proxy.corp:8443/"\n'
    assert parse_config(written).control_plane.proxy == "https://ada:pw@proxy.corp:8443"
    overridden = parse_config(written, env={"SYNCD_CONTROL_PLANE_PROXY": ""})
    assert overridden.control_plane.proxy is None


def test_no_config_error_shows_a_password() -> None:
    """The rule holds for every URL-shaped value, a hub's PostgreSQL DSN included."""
    with pytest.raises(ConfigError) as caught:
        parse_config(b'[hub]\nstore = "mysql://hub:s3cret@db/hub"\n')
    assert "s3cret" not in str(caught.value) and "mysql://hub:***@db/hub" in str(caught.value)


async def test_a_daemon_uses_its_proxy_option(tmp_path: Path) -> None:
    """`syncd run` with ``[control_plane] proxy``: every request to the plane goes through it,
    whatever the environment says (HTTP_PROXY naming another proxy, NO_PROXY the plane)."""
    async with serving_hub(tmp_path / "hub") as plane, \
            ForwardProxy(hosts={PLANE: "127.0.0.1"}) as proxy, ForwardProxy() as decoy:
        (tmp_path / "plane-token").write_text(plane.token)
        config = tmp_path / "syncd.toml"
        config.write_text(f'[control_plane]\nurl = "http://{PLANE}:{plane.port}"\n'
                          f'proxy = "{proxy.url}"\n'
                          f'token_file = "{tmp_path / "plane-token"}"\n'
                          f'embedding_model = "{MODEL}"\n[sync]\ninterval_secs = 3600\n'
                          f'[entitlement]\npublic_keys = ["{plane.public_key}"]\n')
        env = environment(tmp_path, **every_proxy_variable(decoy.url), NO_PROXY=PLANE)
        args = ["--config", str(config), "--data-dir", str(tmp_path / "data")]
        async with running_daemon(env, *args):
            code, _, err = await syncd(env, *args, "save", NOTE, "--type", "procedure")
            assert code == 0, err
            code, out, err = await syncd(env, *args, "sync", "--json")
            assert code == 0 and json.loads(out)["ok"], err + out
        assert await holds_note(plane)
        assert proxy.requests and all(r.target.startswith(f"http://{PLANE}:{plane.port}/v1/agent/")
                                      for r in proxy.requests)
        assert decoy.connections == 0
