"""The web page for people, in headless Chromium against a real daemon and hub (conftest.py).

1. The page, end to end: log in with ``syncd open``'s one-time URL, search with filters (score
   components, validity, graph path, linked resources, the fallback label), open a memory
   (content, edges, supersession history both ways), archive it and change its importance,
   edit the settings (a saved weight; a client-side and a server-side error shown at their
   field, nothing saved), run a sync pass; memory text with markup renders as text. A
   screenshot of each of the four views is saved.
2. Other origins, cross-site (``localhost``) and same-site (``127.0.0.1`` on another port),
   can neither read the API with the browser's session nor change anything through it; the
   session cookie is HttpOnly and SameSite=Strict; without a session the page shows only how
   to log in.
3. The session's key (the login's ``#key=`` fragment) leaves the address bar at once and stays
   in the tab: a reload keeps the session, reads and writes work; a new tab typed by hand has
   only the cookie, which reads nothing, so that tab asks to log in again.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from tests.web.conftest import Stack

if TYPE_CHECKING:
    from playwright.async_api import Browser, ConsoleMessage, Dialog, Page

XSS_TITLE = "<b>bold?</b> markup in a title"
XSS_CONTENT = ("Never render this as HTML: <script>alert(1)</script> "
               "<img src=x onerror=alert(2)> — it is a note about escaping.")


def quote(memory_id: str) -> str:
    """A memory id as the page puts it in a hash route (encodeURIComponent)."""
    return memory_id.replace(":", "%3A")


async def seed(stack: Stack) -> dict[str, str]:
    """A superseded decision, its successor, a fact linked to it, an external link and a
    memory full of markup. Returns their ids by name."""
    old = await stack.tool(
        "save_memory", content="The hub feed runs on PostgreSQL 15.",
        title="Hub database: PostgreSQL 15", memory_type="decision", realm="infra",
        tags=["db", "hub"])
    new = await stack.tool(
        "save_memory", content="The hub feed runs on PostgreSQL 16: its logical replication "
        "fixes the feed gaps.", title="Hub database: PostgreSQL 16", memory_type="decision",
        realm="infra", tags=["db", "hub"], importance=0.8)
    judged = await stack.tool("memory_judge", memory_id=new["node_id"],
                              target_id=old["node_id"], verdict="supersedes",
                              reason="16 fixes the feed gaps")
    assert judged["verdict"] == "supersedes"
    fact = await stack.tool("save_memory", content="Staging runs in eu-west-1 next to the hub.",
                            memory_type="fact", realm="infra", tags=["staging"])
    await stack.tool("link_memory_to_entity", memory_id=fact["node_id"],
                     target_node_id=new["node_id"], relationship_type="DEPENDS_ON")
    await stack.tool("link_memory_to_entity", memory_id=new["node_id"],
                     target_node_id="repo:syncd", relationship_type="REFERENCES")
    xss = await stack.tool("save_memory", content=XSS_CONTENT, title=XSS_TITLE,
                           memory_type="learning", realm="web", tags=["escaping"])
    return {"old": old["node_id"], "new": new["node_id"], "fact": fact["node_id"],
            "xss": xss["node_id"]}


@asynccontextmanager
async def page_for(browser: Browser, *, expected: tuple[int, ...] = ()) -> AsyncIterator[
        tuple[Page, list[str], list[str]]]:
    """A fresh browser context and page, with the console errors (CSP violations among them)
    and dialogs it produced; a failed load with an ``expected`` status is not an error. Every
    dialog is an XSS that ran: it is recorded and dismissed."""
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    errors: list[str] = []
    dialogs: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type != "error":
            return
        where = str(message.location.get("url", ""))
        if where.endswith("/favicon.ico") or any(
                f"status of {status} " in message.text for status in expected):
            return
        errors.append(f"{message.text} at {where}")

    async def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("console", on_console)
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.on("dialog", on_dialog)
    try:
        yield page, errors, dialogs
    finally:
        await context.close()


async def log_in(stack: Stack, page: Page) -> None:
    from playwright.async_api import expect
    await page.goto(await stack.login_url())
    # the 303 dropped the code from the URL, and the page took the key out of the fragment
    assert page.url == stack.url + "/", page.url
    await expect(page.locator("#tabs")).to_be_visible()
    await expect(page.locator("#logged-out")).to_be_hidden()
    kept = await page.evaluate("() => [location.href, Object.values(sessionStorage)]")
    assert kept[0] == stack.url + "/" and len(kept[1]) == 1 and len(kept[1][0]) >= 32, kept


async def settings_ready(page: Page) -> None:
    """The Settings view is shown and its settings have loaded (``data-state="ready"``). Call it
    after opening the view from another one: the view turns visible in the same task that marks
    it "loading", so the "ready" seen after that is this opening's, never an earlier one's."""
    from playwright.async_api import expect
    view = page.locator("#view-settings")
    await expect(view).to_be_visible()
    await expect(view).to_have_attribute("data-state", "ready")


async def shot(page: Page, directory: Path, name: str, min_bytes: int = 5000) -> Path:
    path = directory / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    assert (await asyncio.to_thread(path.stat)).st_size > min_bytes  # not blank
    return path


async def test_the_page_end_to_end(browser: Browser, stack: Stack,
                                   screenshot_dir: Path) -> None:
    from playwright.async_api import expect
    ids = await seed(stack)
    async with page_for(browser, expected=(422,)) as (page, errors, dialogs):
        await log_in(stack, page)

        # ------------------------------------------------------------------ search
        await expect(page.locator('#tabs a[data-tab="search"]')).to_have_attribute(
            "aria-current", "page")
        await page.fill("#q", "zzqx qwv")
        await page.click("#search-submit")
        await expect(page.locator("#fallback-banner")).to_contain_text(
            "No match — most important recent memories")

        await page.fill("#q", "hub database")
        await page.fill("#f-realms", "infra")
        await page.select_option("#f-type", "decision")
        await page.fill("#f-tags", "db, hub")
        await page.check("#f-invalidated")
        await page.click("#search-submit")
        # both decisions match; the fact linked to the new one comes through the graph
        await expect(page.locator(".hit")).to_have_count(3)
        await expect(page.locator("#fallback-banner")).to_have_count(0)
        new_hit = page.locator(f'.hit[data-id="{ids["new"]}"]')
        old_hit = page.locator(f'.hit[data-id="{ids["old"]}"]')
        await expect(new_hit.locator(".hit-title")).to_have_text("Hub database: PostgreSQL 16")
        await expect(new_hit.locator(".comp")).to_have_count(7)
        keyword = await new_hit.locator('.comp[data-component="keyword"] .comp-value').text_content()
        assert keyword is not None and float(keyword) > 0.5
        await expect(new_hit.locator(".validity")).to_contain_text("now")
        await expect(old_hit).to_contain_text("superseded")
        await expect(old_hit.locator('.comp[data-component="penalty"] .comp-value')).to_have_text(
            "0.300")
        await expect(old_hit.locator(".validity")).not_to_contain_text("now")
        assert await page.locator("#f-as-of").input_value() == ""

        # the daemon's 422 for a bad as_of lands at that input; then the default filters
        await page.fill("#f-as-of", "yesterday")
        await page.click("#search-submit")
        await expect(page.locator('.field-error[data-for="as_of"]')).to_have_text(
            "invalid RFC 3339 timestamp: 'yesterday'")
        await page.fill("#f-as-of", "")
        await page.select_option("#f-type", "")
        await page.fill("#f-tags", "")
        await page.uncheck("#f-invalidated")
        await page.click("#search-submit")
        fact_hit = page.locator(f'.hit[data-id="{ids["fact"]}"]')
        await expect(fact_hit.locator(".via")).to_have_text(
            "via graph: Hub database: PostgreSQL 16 → DEPENDS_ON, depth 1")
        await expect(fact_hit.locator(f'.via a[href="#/memory/{quote(ids["new"])}"]')).to_have_count(1)
        await expect(page.locator("#linked")).to_contain_text("repo:syncd")
        await expect(page.locator("#linked")).to_contain_text("REFERENCES")
        search_png = await shot(page, screenshot_dir, "search")

        # ------------------------------------------------------------------ one memory
        await new_hit.locator(".preview").click()  # the whole card opens it
        await expect(page).to_have_url(re.compile(r"#/memory/memory%3A"))
        await expect(page.locator("#memory-title")).to_have_text("Hub database: PostgreSQL 16")
        await expect(page.locator("#memory-content")).to_have_text(
            "The hub feed runs on PostgreSQL 16: its logical replication fixes the feed gaps.")
        edges = page.locator("#memory-edges")
        for text in ("INVALIDATES", "REFERENCES", "repo:syncd", "DEPENDS_ON", "Outgoing (2)",
                     "Incoming (1)"):
            await expect(edges).to_contain_text(text)
        await expect(page.locator("#replaced")).to_contain_text("Hub database: PostgreSQL 15")
        await expect(page.locator("#history-current")).to_contain_text("nothing has replaced")
        await expect(page.locator("#memory-details")).to_contain_text("db, hub")

        await page.locator("#replaced a").click()
        await expect(page.locator("#memory-title")).to_have_text("Hub database: PostgreSQL 15")
        replaced_by = page.locator("#replaced-by")
        await expect(replaced_by).to_contain_text("replaced by Hub database: PostgreSQL 16")
        await expect(replaced_by.locator("time")).to_have_count(1)  # when: its invalid_at
        await expect(replaced_by).to_contain_text("16 fixes the feed gaps")  # why
        await expect(page.locator("#memory-status")).to_have_text("active")

        await page.click("#memory-archive")
        await expect(page.locator("#memory-message")).to_contain_text("Archived")
        await expect(page.locator("#memory-status")).to_have_text("archived")
        await expect(page.locator("#memory-archive")).to_have_text("Unarchive")
        assert (await stack.memory(ids["old"]))["status"] == "archived"

        await page.fill("#memory-importance", "1.5")
        await page.click("#memory-importance-save")
        await expect(page.locator("#memory-message")).to_contain_text("from 0 to 1")
        assert (await stack.memory(ids["old"]))["importance"] == 0.5
        await page.fill("#memory-importance", "0.9")
        await page.click("#memory-importance-save")
        await expect(page.locator("#memory-message")).to_contain_text("Saved: importance 0.9")
        await expect(page.locator("#memory-importance")).to_have_value("0.9")
        assert (await stack.memory(ids["old"]))["importance"] == 0.9
        memory_png = await shot(page, screenshot_dir, "memory")

        # markup in a memory is text, in the results and in its own view
        await page.click('#tabs a[data-tab="search"]')
        await page.fill("#q", "escaping note markup")
        await page.fill("#f-realms", "web")
        await page.click("#search-submit")
        xss_hit = page.locator(f'.hit[data-id="{ids["xss"]}"]')
        await expect(xss_hit.locator(".hit-title")).to_have_text(XSS_TITLE)
        await xss_hit.locator(".hit-title").click()
        await expect(page.locator("#memory-content")).to_have_text(XSS_CONTENT)
        await expect(page.locator("#memory-title")).to_have_text(XSS_TITLE)
        assert await page.locator("#main script, #main img, #main b").count() == 0

        # ------------------------------------------------------------------ settings
        await page.click('#tabs a[data-tab="settings"]')
        await settings_ready(page)
        weight = page.locator("#s-w_keyword")
        await expect(weight).to_have_value("0.3")
        for key in ("w_rrf", "w_semantic", "w_graph", "w_importance", "w_recency",
                    "half_life_days", "rrf_k", "default_limit", "embedding_model",
                    "dreaming.mode", "dreaming.interval_secs", "hitl.ops.archive",
                    "hitl.confidence_threshold", "hitl.type_scope"):
            await expect(page.locator(f'[data-path="{key}"]')).to_have_count(1)
        await weight.fill("0.45")
        await page.click("#settings-save")
        await expect(page.locator("#settings-message")).to_have_text("Saved.")
        assert (await stack.ok("GET", "/v1/agent/memory/settings"))["w_keyword"] == 0.45
        settings_png = await shot(page, screenshot_dir, "settings")

        await weight.fill("-1")  # checked as typed
        error = page.locator('.field[data-setting="w_keyword"] .field-error')
        await expect(error).to_have_text("must be at least 0")
        await page.click("#settings-save")
        await expect(page.locator("#settings-message")).to_contain_text("Not saved")
        assert (await stack.ok("GET", "/v1/agent/memory/settings"))["w_keyword"] == 0.45

        # a value only the daemon refuses: its 422 lands at the field it names
        await weight.fill("0.45")
        await expect(error).to_be_hidden()
        await page.locator("#s-default_limit").evaluate(
            "el => { el.type = 'text'; el.dataset.kind = 'text'; }")
        await page.fill("#s-default_limit", "lots")
        await page.click("#settings-save")
        limit_error = page.locator('.field[data-setting="default_limit"] .field-error')
        await expect(limit_error).to_contain_text("Expected `int`, got `str`")
        await expect(page.locator("#settings-message")).to_contain_text("refused default_limit")
        settings = await stack.ok("GET", "/v1/agent/memory/settings")
        assert settings["default_limit"] == 8 and settings["w_keyword"] == 0.45

        # ------------------------------------------------------------------ sync
        await page.click('#tabs a[data-tab="sync"]')
        await expect(page.locator("#sync-plane")).to_contain_text(stack.hub.url)
        await expect(page.locator("#sync-gate")).to_contain_text("entitled")
        await expect(page.locator("#sync-gate")).to_contain_text("sync: on")
        await page.click("#sync-now")
        await expect(page.locator("#sync-message")).to_contain_text("Pass done")
        await expect(page.locator('#sync-health [data-key="last_success"] time')).to_have_count(1)
        await expect(page.locator('#sync-health [data-key="outbox"]')).to_have_text("0")
        # a hub names its model: nothing waits for a plane-model vector (docs/plane-vectors.md)
        await expect(page.locator('#sync-health [data-key="awaiting_vector"]')).to_have_text("0")
        pushed = page.locator('#sync-last-pass [data-key="pushed_nodes"] dd')
        await expect(pushed).to_have_text(re.compile(r"^\d+$"))
        for phase in ("pull", "push", "repair", "wire"):
            await expect(page.locator(f'#sync-last-pass [data-phase="{phase}"]')).to_have_count(1)
        status = await stack.ok("GET", "/v1/agent/sync/status")
        assert status["last_success"] and status["outbox"] == 0
        assert await stack.hub.count("SELECT count(*) FROM memories") >= 4
        sync_png = await shot(page, screenshot_dir, "sync")

        assert not dialogs, dialogs
        assert not errors, errors
    for path in (search_png, memory_png, settings_png, sync_png):
        print(f"screenshot: {path}")


# ---------------------------------------------------------------------- other origins


ATTACK_PAGE = """<!doctype html>
<html><head><title>elsewhere</title></head>
<body>
<pre id="out"></pre>
<iframe name="sink" id="sink"></iframe>
<form id="form" method="POST" enctype="text/plain" target="sink" action="{write_url}">
<input type="hidden" name='{form_name}' value='"}}'>
</form>
<script>
const target = {target};
const out = document.getElementById("out");
const log = (line) => {{ out.textContent += line + "\\n"; }};
async function attempt(label, url, init) {{
  try {{
    const response = await fetch(url, init);
    let body = "";
    try {{ body = await response.text(); }} catch (e) {{ body = "unreadable " + e.name; }}
    log(label + ": status " + response.status + " type " + response.type + " body " + body);
  }} catch (e) {{
    log(label + ": blocked " + e.name);
  }}
}}
(async () => {{
  await attempt("read", target.read, {{credentials: "include"}});
  await attempt("write", target.write, {{method: "POST", credentials: "include",
    headers: {{"Content-Type": "application/json"}}, body: target.body}});
  await attempt("settings", target.settings, {{method: "PUT", credentials: "include",
    headers: {{"Content-Type": "application/json"}}, body: '{{"w_keyword": 9}}'}});
  await attempt("simple", target.write, {{method: "POST", mode: "no-cors",
    credentials: "include", headers: {{"Content-Type": "text/plain"}}, body: target.body}});
  const sink = document.getElementById("sink");
  const done = () => {{
    let text;
    try {{ text = "readable " + sink.contentDocument.body.textContent; }}
    catch (e) {{ text = "unreadable " + e.name; }}
    if (sink.contentDocument === null) text = "unreadable (cross-origin)";
    log("form: " + text);
    document.body.dataset.done = "1";
  }};
  sink.addEventListener("load", done, {{once: true}});
  document.getElementById("form").submit();
}})();
</script>
</body></html>
"""


@asynccontextmanager
async def elsewhere(stack: Stack, memory_id: str) -> AsyncIterator[int]:
    """Another web server on 127.0.0.1 (reachable as ``localhost`` too) whose page attacks
    the daemon with the browser's credentials. Yields its port."""
    body = json.dumps({"memory_id": memory_id, "status": "archived"})
    write_url = f"{stack.url}/v1/agent/memory/tools/update_memory_status"
    target = json.dumps({"read": f"{stack.url}/v1/agent/memory/items/{memory_id}",
                         "write": write_url, "body": body,
                         "settings": f"{stack.url}/v1/agent/memory/settings"})
    form_name = body[:-1] + ', "pad": "'  # text/plain form body: NAME=VALUE is JSON again
    page = ATTACK_PAGE.format(write_url=write_url, target=target,
                              form_name=form_name.replace("'", "&#39;"))

    async def attack(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", attack)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def test_other_origins_get_nothing_and_the_cookie_is_strict(
        browser: Browser, stack: Stack) -> None:
    from playwright.async_api import expect
    secret = await stack.tool("save_memory", content="the deploy key rotates on Fridays",
                              title="secret schedule", realm="ops")
    memory_id = secret["node_id"]
    before = await stack.memory(memory_id)
    settings_before = await stack.ok("GET", "/v1/agent/memory/settings")

    async with page_for(browser) as (page, errors, _):
        await log_in(stack, page)
        cookies = [c for c in await page.context.cookies()
                   if c["name"] == f"syncd_session_{stack.port}"]
        assert len(cookies) == 1, await page.context.cookies()
        assert cookies[0]["httpOnly"] is True and cookies[0]["sameSite"] == "Strict"
        assert cookies[0]["domain"] == "127.0.0.1" and cookies[0]["path"] == "/"
        assert "syncd_session" not in await page.evaluate("document.cookie")
        # the page itself can read the memory with that cookie
        await page.evaluate("id => { location.hash = '#/memory/' + encodeURIComponent(id); }",
                            memory_id)
        await expect(page.locator("#memory-content")).to_have_text(
            "the deploy key rotates on Fridays")

        async with elsewhere(stack, memory_id) as port:
            attacker = await page.context.new_page()
            for origin in (f"http://localhost:{port}", f"http://127.0.0.1:{port}"):
                await attacker.goto(origin + "/")
                await expect(attacker.locator("body")).to_have_attribute("data-done", "1",
                                                                         timeout=15_000)
                out = await attacker.locator("#out").text_content() or ""
                lines = dict(line.split(": ", 1) for line in out.strip().splitlines())
                assert set(lines) == {"read", "write", "settings", "simple", "form"}, out
                for label in ("read", "write", "settings"):
                    assert lines[label] == "blocked TypeError", (origin, out)
                assert lines["simple"] == "status 0 type opaque body ", (origin, out)
                assert lines["form"].startswith("unreadable"), (origin, out)
                assert "Fridays" not in out
            await attacker.close()
        assert not errors, errors

    after = await stack.memory(memory_id)
    assert after["status"] == "active" and after["updated_at"] == before["updated_at"]
    assert await stack.ok("GET", "/v1/agent/memory/settings") == settings_before


async def test_without_a_session_the_page_only_says_how_to_log_in(
        browser: Browser, stack: Stack, screenshot_dir: Path) -> None:
    from playwright.async_api import expect
    await stack.tool("save_memory", content="nothing of this may show", title="private")
    url = await stack.login_url()
    async with page_for(browser, expected=(401,)) as (page, errors, _):
        await page.goto(stack.url + "/#/search")
        message = page.locator("#logged-out")
        await expect(message).to_be_visible()
        await expect(page.locator("#logged-out-message")).to_have_text(
            "Not logged in — run syncd open in a terminal")
        for hidden in ("#tabs", "#logout", "#view-search", "#view-memory", "#view-sync",
                       "#view-settings", "#booting"):
            await expect(page.locator(hidden)).to_be_hidden()
        assert "nothing of this" not in (await page.content())
        assert not errors, errors
        await shot(page, screenshot_dir, "logged-out", min_bytes=1000)

        await page.goto(url)  # the link works once...
        await expect(page.locator("#tabs")).to_be_visible()
        await page.click("#logout")  # ...and logging out ends the session
        await expect(page.locator("#logged-out")).to_be_visible()
        await page.reload()
        await expect(page.locator("#logged-out")).to_be_visible()
        response = await page.goto(url)
        assert response is not None and response.status == 401
        assert "used up or expired" in await page.content()



async def test_a_reload_keeps_the_session_and_a_new_tab_asks_to_log_in_again(
        browser: Browser, stack: Stack) -> None:
    from playwright.async_api import expect
    await stack.tool("save_memory", content="The staging database restarts at 03:00.",
                     title="staging restarts", realm="ops")
    async with page_for(browser) as (page, errors, _):
        await log_in(stack, page)
        key = (await page.evaluate("() => Object.values(sessionStorage)"))[0]
        assert key not in await page.evaluate("() => document.cookie + location.href")

        async def works() -> None:  # a read and a write, each with the key
            await page.click('#tabs a[data-tab="search"]')
            await page.fill("#q", "staging database restarts")
            await page.click("#search-submit")
            await expect(page.locator(".hit .hit-title").first).to_have_text("staging restarts")
            await page.click('#tabs a[data-tab="settings"]')
            await settings_ready(page)  # not the form an earlier opening left: its answer
            current = (await stack.ok("GET", "/v1/agent/memory/settings"))["w_keyword"]
            weight = page.locator("#s-w_keyword")
            await expect(weight).to_have_value(str(current))
            value = "0.35" if current != 0.35 else "0.4"
            await weight.fill(value)
            await page.click("#settings-save")
            await expect(page.locator("#settings-message")).to_have_text("Saved.")
            assert (await stack.ok("GET", "/v1/agent/memory/settings"))["w_keyword"] == float(
                value)

        await works()
        await page.reload()  # the same tab: the key is still in its sessionStorage
        await expect(page.locator("#tabs")).to_be_visible()
        await expect(page.locator("#logged-out")).to_be_hidden()
        await works()

        # a tab typed by hand shares the cookie but not the key: it is logged out
        other = await page.context.new_page()
        await other.goto(stack.url + "/#/search")
        await expect(other.locator("#logged-out")).to_be_visible()
        await expect(other.locator("#logged-out-message")).to_have_text(
            "Not logged in — run syncd open in a terminal")
        await expect(other.locator("#tabs")).to_be_hidden()
        statuses = await other.evaluate("""async () => [
            (await fetch("/ui/session")).status,
            (await fetch("/v1/agent/memory/settings")).status,
            (await fetch("/v1/agent/memory/settings", {method: "PUT", body: "{}",
              headers: {"Content-Type": "application/json"}})).status]""")
        assert statuses == [401, 403, 403], statuses
        assert "staging" not in await other.content()
        await other.close()

        await page.reload()  # the first tab is still logged in
        await expect(page.locator("#tabs")).to_be_visible()
        await works()
        assert not errors, errors
