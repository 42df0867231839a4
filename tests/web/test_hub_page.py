"""The web page on a hub, in headless Chromium against the real hub app (conftest.py
``hub_page``), on a SQLite and on a PostgreSQL hub store.

Signed out, the page shows only the token form; a wrong token shows the hub's own message. A
read token signs in: search finds a seeded memory with its score components and its details in
place (the hub has no memory view, so hits are no links); Status reports the store, the token
and its role; Settings are shown read-only, and the hub itself refuses a forced save (403,
shown). Sign out ends the session. A write token signs in and saves a weight, which the hub
store then holds. Revoking that token ends its session: the next action shows the token form.
The token is never kept by the page: not in localStorage, sessionStorage, a script-readable
cookie, the DOM or the URL.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from local_store import HashingEmbedder
from protocol.rows import NodeRow
from protocol.timestamp import format_ns
from tests.web.conftest import HubPage
from tests.web.test_browser import XSS_CONTENT, XSS_TITLE, page_for, settings_ready, shot

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

MODEL = HashingEmbedder().model_id
DECISION = "memory:hub-db-decision"
FACT = "memory:staging-region"
MARKUP = "memory:markup-note"


def row(mid: str, content: str, *, title: str | None = None, memory_type: str = "fact",
        realm: str = "infra", tags: tuple[str, ...] = (), importance: float = 0.5) -> NodeRow:
    """One memory version as a laptop would push it (its embedding included)."""
    stamp = format_ns(time.time_ns() - 3_600_000_000_000)  # an hour ago
    embedding = HashingEmbedder().embed([content])[0]
    return NodeRow(id=mid, content=content, title=title, realm=realm, memory_type=memory_type,
                   tags=",".join(tags) or None, importance=importance, status="active",
                   created_at=stamp, updated_at=stamp, valid_at=stamp, origin="laptop-a",
                   embedding=list(embedding))


async def seed(served: HubPage) -> None:
    result = await served.hub.apply([
        row(DECISION, "The hub feed runs on PostgreSQL 16: its logical replication fixes the "
            "feed gaps.", title="Hub database: PostgreSQL 16", memory_type="decision",
            tags=("db", "hub"), importance=0.8),
        row(FACT, "Staging runs in eu-west-1 next to the hub.", tags=("staging",)),
        row(MARKUP, XSS_CONTENT, title=XSS_TITLE, memory_type="learning", realm="web"),
    ], [], model=MODEL)
    assert result.applied_nodes == 3


async def sign_in(page: Page, token: str) -> None:
    from playwright.async_api import expect
    await page.fill("#hub-token", token)
    await page.click("#hub-login-submit")
    await expect(page.locator("#tabs")).to_be_visible()
    await expect(page.locator("#hub-login")).to_be_hidden()
    assert await page.locator("#hub-token").input_value() == ""  # not left in the form


async def signed_out(page: Page) -> None:
    """Only the token form: no tabs, no views, no data."""
    from playwright.async_api import expect
    await expect(page.locator("#hub-login")).to_be_visible()
    for hidden in ("#tabs", "#logout", "#logged-out", "#booting", "#view-search",
                   "#view-status", "#view-settings", "#view-memory", "#view-sync"):
        await expect(page.locator(hidden)).to_be_hidden()
    await expect(page.locator("#search-results .hit")).to_have_count(0)
    await expect(page.locator("#status-body *")).to_have_count(0)
    await expect(page.locator("#settings-form [data-path]")).to_have_count(0)


async def assert_token_not_kept(page: Page, served: HubPage, *tokens: str) -> None:
    kept = await page.evaluate("""() => JSON.stringify({
        local: Object.entries(localStorage), session: Object.entries(sessionStorage),
        cookie: document.cookie, url: location.href})""")
    html = await page.content()
    for token in tokens:
        assert token not in kept and token not in html, kept
    assert "syncd_session" not in await page.evaluate("document.cookie")
    for cookie in await page.context.cookies():  # the session cookie is HttpOnly and Strict
        assert cookie["name"] == f"syncd_session_{served.port}", cookie
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
        assert cookie["value"] not in tokens


async def test_the_hub_page_signs_in_with_a_token(browser: Browser, hub_page: HubPage,
                                                  screenshot_dir: Path) -> None:
    from playwright.async_api import expect
    served, hub = hub_page, hub_page.hub
    await seed(served)
    reader = await hub.tokens.create(role="read", name="viewer")
    writer = await hub.tokens.create(role="write", name="editor")
    suffix = "" if served.store == "sqlite" else "-" + served.store
    async with page_for(browser, expected=(401, 403)) as (page, errors, dialogs):
        # ------------------------------------------------------------------ signed out
        await page.goto(served.url + "/#/search")
        await signed_out(page)
        await expect(page.locator('label[for="hub-token"]')).to_have_text("Hub token")
        await expect(page.locator("#hub-token")).to_have_attribute("type", "password")
        await expect(page.locator("#hub-login-message")).to_be_hidden()
        assert "PostgreSQL 16" not in await page.content()
        await shot(page, screenshot_dir, "hub-login" + suffix, min_bytes=1000)

        await page.fill("#hub-token", "syncd_not-a-token")
        await page.click("#hub-login-submit")
        await expect(page.locator("#hub-login-message")).to_have_text("unknown token")
        await signed_out(page)

        # ------------------------------------------------------------------ a read token
        await sign_in(page, reader)
        await assert_token_not_kept(page, served, reader)
        for tab, shown in (("search", True), ("status", True), ("settings", True),
                           ("memory", False), ("sync", False)):
            link = page.locator(f'#tabs a[data-tab="{tab}"]')
            await (expect(link).to_be_visible() if shown else expect(link).to_be_hidden())
        await expect(page.locator('#tabs a[data-tab="search"]')).to_have_attribute(
            "aria-current", "page")
        await expect(page.locator("#logout")).to_have_text("Sign out")

        await page.fill("#q", "hub database")
        await page.fill("#f-realms", "infra")
        await page.click("#search-submit")
        hit = page.locator(f'.hit[data-id="{DECISION}"]')
        await expect(hit.locator(".hit-title")).to_have_text("Hub database: PostgreSQL 16")
        await expect(hit.locator(".comp")).to_have_count(7)
        keyword = await hit.locator('.comp[data-component="keyword"] .comp-value').text_content()
        assert keyword is not None and float(keyword) > 0.5
        await expect(hit.locator(".validity")).to_contain_text("now")
        assert await page.locator('#search-results a[href^="#/memory"]').count() == 0
        details = hit.locator("details.hit-details")
        await expect(details.locator('[data-key="id"]')).to_be_hidden()
        await hit.locator(".preview").click()  # the card opens in place
        await expect(details.locator('[data-key="id"]')).to_have_text(DECISION)
        await expect(details.locator('[data-key="memory_type"]')).to_have_text("decision")
        await expect(details.locator('[data-key="content_preview"]')).to_contain_text(
            "logical replication")
        await shot(page, screenshot_dir, "hub-search" + suffix)

        await page.fill("#q", "escaping note markup")
        await page.fill("#f-realms", "web")
        await page.click("#search-submit")
        markup = page.locator(f'.hit[data-id="{MARKUP}"]')
        await expect(markup.locator(".hit-title")).to_have_text(XSS_TITLE)
        await expect(markup.locator(".preview")).to_have_text(XSS_CONTENT)
        assert await page.locator("#main script, #main img, #main b").count() == 0

        await page.click('#tabs a[data-tab="status"]')
        status = page.locator("#status-hub")
        await expect(status.locator('[data-key="store"]')).to_have_text(served.store)
        await expect(status.locator('[data-key="role"]')).to_have_text("hub")
        await expect(status.locator('[data-key="store_id"]')).to_have_text(hub.store_id)
        await expect(status.locator('[data-key="embedding_model"]')).to_have_text(MODEL)
        await expect(page.locator('#status-counts [data-key="memories"]')).to_have_text("3")
        await expect(page.locator('#status-session [data-key="name"]')).to_have_text("viewer")
        await expect(page.locator('#status-session [data-key="role"]')).to_have_text("read")
        await shot(page, screenshot_dir, "hub-status" + suffix)

        await page.click('#tabs a[data-tab="settings"]')
        await settings_ready(page)
        weight = page.locator("#s-w_keyword")
        await expect(weight).to_have_value("0.3")
        await expect(weight).to_be_disabled()
        await expect(page.locator("#settings-save")).to_be_disabled()
        await expect(page.locator("#settings-readonly")).to_have_text(
            "read-only token: settings need a write token")
        # the hub decides, not the page: a save forced through is refused, and shown
        await page.evaluate("""() => { for (const el of document.querySelectorAll(
            '#settings-form [data-path], #settings-save')) el.disabled = false; }""")
        await weight.fill("0.9")
        await page.click("#settings-save")
        await expect(page.locator("#settings-message")).to_have_text(
            "Not saved: token role `read` below required `write`")
        assert (await hub.settings()).w_keyword == 0.3

        await page.click("#logout")
        await signed_out(page)
        await expect(page.locator("#hub-login-message")).to_be_hidden()
        await page.reload()  # the session ended on the hub too
        await signed_out(page)

        # ------------------------------------------------------------------ a write token
        await sign_in(page, writer)
        await expect(page.locator("#view-settings")).to_be_visible()  # still #/settings
        await settings_ready(page)
        await expect(page.locator("#settings-readonly")).to_be_hidden()
        await expect(page.locator("#s-embedding_model")).to_be_disabled()  # the hub's own
        await expect(weight).to_be_enabled()
        await weight.fill("0.45")
        await page.click("#settings-save")
        await expect(page.locator("#settings-message")).to_have_text("Saved.")
        await expect(weight).to_have_value("0.45")
        await expect(page.locator("#s-embedding_model")).to_have_value(MODEL)
        settings = await hub.settings()
        assert settings.w_keyword == 0.45 and settings.w_semantic == 0.6
        await shot(page, screenshot_dir, "hub-settings" + suffix)
        await page.reload()  # the session outlives the page
        await expect(page.locator("#tabs")).to_be_visible()
        await expect(weight).to_have_value("0.45")
        await expect(weight).to_be_enabled()
        await page.click('#tabs a[data-tab="status"]')
        await expect(page.locator('#status-session [data-key="role"]')).to_have_text("write")
        await expect(page.locator('#status-session [data-key="name"]')).to_have_text("editor")
        await assert_token_not_kept(page, served, reader, writer)

        # ------------------------------------------------------------------ revoked
        assert await hub.tokens.revoke("editor")
        await page.click("#status-refresh")
        await signed_out(page)
        await expect(page.locator("#hub-login-message")).to_contain_text("Not signed in")
        await page.reload()  # a revoked token's session is over for a fresh page too
        await signed_out(page)
        await expect(page.locator("#tabs")).to_be_hidden()
        await assert_token_not_kept(page, served, reader, writer)

        assert not dialogs, dialogs
        assert not errors, errors
