"""The Memory view lists, edits and deletes; the page is usable at 420 px; the plane-only
settings are folded away; a resolved sync error says so (issue 35). A real ``syncd run`` and
hub, driven in headless Chromium."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from local_store.records import MAX_REALM_CHARS
from tests.web.conftest import Stack
from tests.web.test_browser import log_in, page_for, seed, settings_ready, shot

if TYPE_CHECKING:
    from playwright.async_api import Page


async def rows(page: Page) -> list[str]:
    """The ids the list shows, top to bottom."""
    ids = await page.locator("#memory-list-rows .list-row").evaluate_all(
        "els => els.map(el => el.dataset.id)")
    return [str(i) for i in ids]


async def test_the_memory_view_lists_pages_filters_edits_and_deletes(
        browser: Any, stack: Stack) -> None:
    from playwright.async_api import expect
    saved = []
    for n in range(23):
        answer = await stack.tool("save_memory", content=f"Note number {n} about the list.",
                                  realm="ops" if n % 2 else "dev",
                                  memory_type="fact" if n % 3 else "decision",
                                  tags=["alpha"] if n % 5 == 0 else ["beta"])
        saved.append(answer["node_id"])
    async with page_for(browser, expected=(422,)) as (page, errors, dialogs):
        await log_in(stack, page)
        await page.click('#tabs a[data-tab="memory"]')
        await expect(page.locator("#memory-list-rows .list-row")).to_have_count(20)
        await expect(page.locator("#view-memory")).not_to_contain_text(
            "Open a memory from a search result")
        first = await rows(page)
        assert first[0] == saved[-1], first  # newest first
        await expect(page.locator("#list-prev")).to_be_disabled()
        await page.click("#list-next")
        await expect(page.locator("#list-range")).to_have_text("21–23")
        second = await rows(page)
        assert len(second) == 3 and not set(first) & set(second)
        assert set(first) | set(second) == set(saved)
        await expect(page.locator("#list-next")).to_be_disabled()
        await page.click("#list-prev")
        await expect(page.locator("#list-range")).to_have_text("1–20")

        # filters: realm, type and tag together
        await page.fill("#list-realm", "ops")
        await page.select_option("#list-type", "fact")
        await page.fill("#list-tags", "beta")
        await page.click("#list-submit")
        want = [saved[n] for n in reversed(range(23)) if n % 2 and n % 3 and n % 5]
        await expect(page.locator("#memory-list-rows .list-row")).to_have_count(len(want))
        assert await rows(page) == want
        # a bad filter is refused by name, and the form says which field
        await page.fill("#list-realm", "x" * (MAX_REALM_CHARS + 1))
        await page.click("#list-submit")
        await expect(page.locator("#list-error")).to_contain_text("(field: realm)")
        await expect(page.locator("#list-realm")).to_have_class("invalid")
        await page.fill("#list-realm", "")
        await page.select_option("#list-type", "")
        await page.fill("#list-tags", "")
        await page.click("#list-submit")
        await expect(page.locator("#memory-list-rows .list-row")).to_have_count(20)

        # edit title, content, tags and importance in one save
        target = saved[-1]
        await page.click(f'.list-row[data-id="{target}"] .hit-title')
        await expect(page.locator("#memory-title")).to_have_text(
            "Note number 22 about the list.")
        await page.fill("#edit-title", "Edited title")
        await page.fill("#edit-content", "Edited content, second version.")
        await page.fill("#edit-tags", "gamma, delta")
        await page.fill("#edit-importance", "0.9")
        await page.click("#edit-save")
        await expect(page.locator("#memory-message")).to_have_text(
            "Saved: title, content, tags, importance")
        await expect(page.locator("#memory-title")).to_have_text("Edited title")
        await expect(page.locator("#memory-content")).to_have_text(
            "Edited content, second version.")
        memory = await stack.memory(target)
        assert (memory["title"], memory["content"], memory["importance"]) == (
            "Edited title", "Edited content, second version.", 0.9)
        assert sorted(memory["tags"]) == ["delta", "gamma"]
        # a bad importance is refused before it is sent, and nothing changes
        await page.fill("#edit-importance", "7")
        await page.click("#edit-save")
        await expect(page.locator("#memory-message")).to_contain_text("Not saved")
        assert (await stack.memory(target))["importance"] == 0.9

        # soft delete, after a confirmation (cancel first: nothing is deleted)
        await page.click("#memory-delete")
        await page.click("#delete-cancel")
        await expect(page.locator("#delete-confirmation")).to_be_hidden()
        assert (await stack.memory(target))["id"] == target
        await page.click("#memory-delete")
        await page.click("#delete-confirm")
        await expect(page.locator("#memory-deleted")).to_have_text(f"Deleted {target}")
        await expect(page.locator("#memory-list-rows .list-row")).to_have_count(20)
        assert target not in await rows(page)
        status, _ = await stack.call("GET", "/v1/agent/memory/items/" + target)
        assert status == 404

        # hard delete: the text is purged
        victim = saved[-2]
        await page.click(f'.list-row[data-id="{victim}"] .hit-title')
        await expect(page.locator("#memory-title")).to_have_text(
            "Note number 21 about the list.")
        await page.click("#memory-delete")
        await page.check("#delete-hard")
        await page.click("#delete-confirm")
        await expect(page.locator("#memory-deleted")).to_have_text(f"Purged {victim}")
        assert victim not in await rows(page)
        status, _ = await stack.call("GET", "/v1/agent/memory/items/" + victim)
        assert status == 404
        # back to the list from a memory
        await page.click(f'.list-row[data-id="{saved[-3]}"] .hit-title')
        await expect(page.locator("#memory-title")).to_contain_text("Note number 20")
        await page.click("#memory-back")
        await expect(page.locator("#memory-list-rows .list-row")).to_have_count(20)
        assert not dialogs, dialogs
        assert not errors, errors


OVERLAPS = """() => {
  // every visible text fragment (a line box of a text node) of the shown view and top bar
  const boxes = [];
  const roots = [document.querySelector(".topbar"),
                 ...document.querySelectorAll(".view:not([hidden])")];
  for (const root of roots) {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (!node.textContent.trim()) continue;
      const el = node.parentElement;
      if (el.closest("option, [hidden], .sr-only, details:not([open]) > :not(summary)")) continue;
      const style = getComputedStyle(el);
      if (style.visibility === "hidden" || style.display === "none") continue;
      const range = document.createRange();
      range.selectNodeContents(node);
      for (const r of range.getClientRects()) {
        if (r.width < 1 || r.height < 1) continue;
        boxes.push({text: node.textContent.trim().slice(0, 40), l: r.left, r: r.right,
                    t: r.top, b: r.bottom});
      }
    }
  }
  const found = [];
  for (let i = 0; i < boxes.length; i++) {
    for (let j = i + 1; j < boxes.length; j++) {
      const a = boxes[i], b = boxes[j];
      const w = Math.min(a.r, b.r) - Math.max(a.l, b.l);
      const h = Math.min(a.b, b.b) - Math.max(a.t, b.t);
      if (w > 1 && h > 1) found.push(`${a.text} × ${b.text}`);
    }
  }
  const wide = boxes.filter((x) => x.r > innerWidth + 1).map((x) => x.text);
  return {count: boxes.length, overlaps: found, beyond: wide,
          scroll: document.documentElement.scrollWidth, width: innerWidth};
}"""


async def no_overlaps(page: Page, view: str) -> None:
    found = await page.evaluate(OVERLAPS)
    assert found["count"] > 5, (view, found)  # the check saw the view
    assert not found["overlaps"], (view, found["overlaps"])
    assert not found["beyond"] and found["scroll"] <= found["width"], (view, found)
    lines = await page.evaluate("""() => { const r = document.createRange();
        r.selectNodeContents(document.querySelector('#logout')); return r.getClientRects()
        .length; }""")
    assert lines == 1, (view, "Log out wraps", lines)


async def test_at_420_px_no_two_labels_overlap(browser: Any, stack: Stack,
                                               screenshot_dir: Path) -> None:
    from playwright.async_api import expect
    ids = await seed(stack)
    async with page_for(browser) as (page, errors, _):
        await page.set_viewport_size({"width": 420, "height": 900})
        await log_in(stack, page)
        await page.fill("#q", "hub database postgresql")
        await page.click("#search-submit")
        await expect(page.locator(".hit .components").first).to_be_visible()
        await no_overlaps(page, "search")
        await shot(page, screenshot_dir, "narrow-search")
        await page.evaluate("id => { location.hash = '#/memory/' + encodeURIComponent(id); }",
                            ids["new"])
        await expect(page.locator("#history-body")).not_to_contain_text("Loading")
        await expect(page.locator("#versions-body")).not_to_contain_text("Loading")
        await no_overlaps(page, "memory")
        await page.click("#memory-back")
        await expect(page.locator("#memory-list-rows .list-row").first).to_be_visible()
        await no_overlaps(page, "memory list")
        await shot(page, screenshot_dir, "narrow-memory-list")
        await page.click('#tabs a[data-tab="sync"]')
        await page.click("#sync-now")
        await expect(page.locator("#sync-message")).to_contain_text("Pass done")
        await no_overlaps(page, "sync")
        await page.click('#tabs a[data-tab="settings"]')
        await settings_ready(page)
        await page.click("#settings-plane > summary")
        await expect(page.locator('[data-path="hitl.enabled"]')).to_be_visible()
        await no_overlaps(page, "settings")
        assert not errors, errors


async def test_plane_only_settings_are_folded_away_with_a_sentence(
        browser: Any, stack: Stack) -> None:
    from playwright.async_api import expect
    async with page_for(browser) as (page, errors, _):
        await log_in(stack, page)
        await page.click('#tabs a[data-tab="settings"]')
        await settings_ready(page)
        plane = page.locator("#settings-plane")
        await expect(plane).not_to_have_attribute("open", "")
        for path in ("dreaming.mode", "hitl.enabled", "reinforcement.enabled", "mmr.lambda"):
            field = page.locator(f'[data-path="{path}"]')
            await expect(field).to_be_hidden()
            assert await plane.locator(f'[data-path="{path}"]').count() == 1
        await expect(page.locator("#s-w_keyword")).to_be_visible()  # recall's own: shown
        await expect(page.locator("#settings-plane-note")).to_be_hidden()
        await page.click("#settings-plane > summary")
        await expect(page.locator("#settings-plane-note")).to_have_text(
            "These are the control plane's settings: this daemon stores and serves them, but "
            "the laptop's recall does not use them.")
        await expect(page.locator('[data-path="hitl.enabled"]')).to_be_visible()
        # a saved plane setting keeps the disclosure open and the value stored
        await page.select_option('[data-path="dreaming.mode"]', "sources")
        await page.click("#settings-save")
        await expect(page.locator("#settings-message")).to_have_text("Saved.")
        await expect(page.locator('[data-path="dreaming.mode"]')).to_be_visible()
        settings = await stack.ok("GET", "/v1/agent/memory/settings")
        assert settings["dreaming"]["mode"] == "sources"
        assert not errors, errors


@contextlib.asynccontextmanager
async def hub_down(stack: Stack) -> AsyncIterator[None]:
    """The hub stops listening, then listens again on the same port."""
    runner: web.AppRunner = stack.hub.runner
    port = stack.hub.url.rsplit(":", 1)[1]
    for site in list(runner.sites):
        await site.stop()
    assert runner.server is not None
    for handler in list(runner.server.connections):  # kept-alive ones too
        handler.force_close()
    try:
        yield
    finally:
        await web.TCPSite(runner, "127.0.0.1", int(port)).start()


async def test_a_resolved_sync_error_is_shown_as_resolved_with_its_time(
        browser: Any, stack: Stack) -> None:
    from playwright.async_api import expect
    async with page_for(browser) as (page, errors, _):
        await log_in(stack, page)
        await page.click('#tabs a[data-tab="sync"]')
        async with hub_down(stack):
            await page.click("#sync-now")
            await expect(page.locator("#sync-message")).to_contain_text("failed")
            await expect(page.locator("#sync-error-open")).to_be_visible()
            await expect(page.locator("#sync-error-resolved")).to_have_count(0)
        await page.click("#sync-now")
        await expect(page.locator("#sync-message")).to_contain_text("Pass done")
        resolved = page.locator("#sync-error-resolved")
        await expect(resolved).to_contain_text("resolved")
        await expect(page.locator("#sync-error-open")).to_have_count(0)
        status = await stack.ok("GET", "/v1/agent/sync/status")
        assert status["last_error"] and status["last_success"] > status["last_error_at"]
        await expect(resolved.locator(".resolved-at time")).to_have_attribute(
            "datetime", status["last_success"])
        # its red is gone: the error's text is muted
        color = await resolved.evaluate("el => getComputedStyle(el).color")
        bad = await page.evaluate("() => getComputedStyle(document.body)"
                                  ".getPropertyValue('--bad').trim()")
        assert bad and color != bad, (color, bad)
        assert not errors, errors
