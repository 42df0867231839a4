"""Late answers, made on purpose: the browser holds one of the page's requests (``page.route``)
until the test lets it go, so what a busy machine does by chance happens every time, in order.

1. The Settings view loads its settings again each time it opens, and the form it showed stays
   editable meanwhile. A value typed before that answer lands is kept (the answer fills only the
   fields nobody typed in) and is what gets saved, checked through the daemon's API; the save
   sends only what was typed. The old "Saved." goes as soon as the view opens again, and a new
   save shows "Saving…" until its own answer.
2. A late load answer (its request answered before a save, delivered after it) never overwrites
   what the save stored, and a save's answer never overwrites a newer save's status nor a value
   typed after it went out.
3. A memory's view that loads again keeps an importance typed meanwhile; the Sync view, opened
   again, no longer shows the last pass's report.

The waits are on page state only: a held request, an element, an attribute, or the page having
read an answer (``window.__answers``, counted by an init script before the page's own code
runs on it).
"""

from __future__ import annotations

import asyncio
import json
import re
from types import TracebackType
from typing import TYPE_CHECKING

from tests.web.conftest import Stack
from tests.web.test_browser import log_in, page_for, quote, settings_ready

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page, Request, Route

SETTINGS = "/v1/agent/memory/settings"

# Counts, by path, the answers whose body the page has read. The page reads every answer with
# ``await response.text()``: this runs first, and the page's code on that answer runs in the
# same microtask checkpoint, so once a count is seen (a later task) the page has applied it.
COUNT_ANSWERS = """
(() => {
  const text = Response.prototype.text;
  window.__answers = {};
  Response.prototype.text = function () {
    const path = new URL(this.url).pathname;
    return text.call(this).then((body) => {
      window.__answers[path] = (window.__answers[path] || 0) + 1;
      return body;
    });
  };
})();
"""


class Held:
    """The page's requests matching ``url`` with a method in ``methods`` wait in the browser
    until the test lets each one go; the others go through."""

    def __init__(self, page: Page, url: str | re.Pattern[str], *methods: str) -> None:
        self.page = page
        self.url = url
        self.methods = set(methods)
        self.routes: asyncio.Queue[Route] = asyncio.Queue()

    async def _route(self, route: Route, request: Request) -> None:
        if request.method in self.methods:
            self.routes.put_nowait(route)
        else:
            await route.continue_()

    async def __aenter__(self) -> Held:
        await self.page.route(self.url, self._route)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.page.unroute(self.url, self._route)

    async def next(self) -> Route:
        """The next held request (the page sent it); an upper bound, not a wait by time."""
        async with asyncio.timeout(15):
            return await self.routes.get()


async def answers(page: Page, path: str) -> int:
    return int(await page.evaluate("p => window.__answers[p] || 0", path))


async def answered(page: Page, path: str, count: int) -> None:
    """The page has read more than ``count`` answers from ``path`` (and applied them)."""
    await page.wait_for_function("([p, n]) => (window.__answers[p] || 0) > n", arg=[path, count])


async def settings(stack: Stack) -> dict[str, object]:
    answer = await stack.ok("GET", SETTINGS)
    assert isinstance(answer, dict)
    return answer


async def open_tab(page: Page, tab: str) -> None:
    from playwright.async_api import expect
    await page.click(f'#tabs a[data-tab="{tab}"]')
    await expect(page.locator(f"#view-{tab}")).to_be_visible()


async def test_a_setting_typed_while_the_view_loads_is_kept_and_saved(
        browser: Browser, stack: Stack) -> None:
    from playwright.async_api import expect
    async with page_for(browser) as (page, errors, _):
        await page.add_init_script(COUNT_ANSWERS)
        await log_in(stack, page)
        await open_tab(page, "settings")
        await settings_ready(page)
        view = page.locator("#view-settings")
        weight, semantic = page.locator("#s-w_keyword"), page.locator("#s-w_semantic")
        message = page.locator("#settings-message")
        await expect(weight).to_have_value("0.3")
        await expect(semantic).to_have_value("0.6")
        await weight.fill("0.4")
        await page.click("#settings-save")
        await expect(message).to_have_text("Saved.")
        assert (await settings(stack))["w_keyword"] == 0.4

        await open_tab(page, "search")
        async with Held(page, stack.url + SETTINGS, "GET") as held:
            await page.click('#tabs a[data-tab="settings"]')
            load = await held.next()  # the view opened again: its settings are on their way
            await expect(view).to_be_visible()
            await weight.fill("0.55")  # into the form still shown
            await stack.ok("PUT", SETTINGS, {"w_semantic": 0.7})  # another client, meanwhile
            read = await answers(page, SETTINGS)
            await load.continue_()  # the answer, late: w_keyword 0.4, w_semantic 0.7
            await answered(page, SETTINGS, read)
        await expect(semantic).to_have_value("0.7")  # the answer fills what nobody typed in
        await expect(weight).to_have_value("0.55")  # and leaves what was typed
        await expect(page.locator('.field[data-setting="w_keyword"]')).to_have_class(
            re.compile(r"\bchanged\b"))  # now compared with the answer's 0.4
        await expect(view).to_have_attribute("data-state", "ready")
        await expect(message).to_be_hidden()  # the earlier save's "Saved." went with it

        async with Held(page, stack.url + SETTINGS, "PUT") as held:
            await page.click("#settings-save")
            put = await held.next()
            await expect(message).to_have_text("Saving…")
            assert json.loads(put.request.post_data or "") == {"w_keyword": 0.55}
            await put.continue_()
            await expect(message).to_have_text("Saved.")
        saved = await settings(stack)
        assert saved["w_keyword"] == 0.55 and saved["w_semantic"] == 0.7, saved
        await expect(weight).to_have_value("0.55")
        await expect(semantic).to_have_value("0.7")
        await expect(page.locator('.field[data-setting="w_keyword"]')).not_to_have_class(
            re.compile(r"\bchanged\b"))
        assert not errors, errors


async def test_a_late_settings_answer_never_overwrites_a_newer_save_or_its_status(
        browser: Browser, stack: Stack) -> None:
    from playwright.async_api import expect
    async with page_for(browser) as (page, errors, _):
        await page.add_init_script(COUNT_ANSWERS)
        await log_in(stack, page)
        await open_tab(page, "settings")
        await settings_ready(page)
        view = page.locator("#view-settings")
        weight, semantic = page.locator("#s-w_keyword"), page.locator("#s-w_semantic")
        message = page.locator("#settings-message")
        await expect(weight).to_have_value("0.3")

        # a load answered before a save, delivered after it
        await open_tab(page, "search")
        async with Held(page, stack.url + SETTINGS, "GET") as held:
            await page.click('#tabs a[data-tab="settings"]')
            load = await held.next()
            stale = await load.fetch()  # the daemon answers now: w_keyword 0.3, w_semantic 0.6
            await weight.fill("0.5")
            await stack.ok("PUT", SETTINGS, {"w_semantic": 0.7})  # another client, meanwhile
            await page.click("#settings-save")
            await expect(message).to_have_text("Saved.")
            saved = await settings(stack)  # only what was typed: the 0.6 shown is not written
            assert saved["w_keyword"] == 0.5 and saved["w_semantic"] == 0.7, saved
            read = await answers(page, SETTINGS)
            await load.fulfill(response=stale)
            await answered(page, SETTINGS, read)
        await expect(weight).to_have_value("0.5")
        await expect(semantic).to_have_value("0.7")  # the save's answer, not the stale one
        await expect(message).to_have_text("Saved.")
        await expect(view).to_have_attribute("data-state", "ready")

        # a save's answer after a newer save started: neither its status nor its values win
        async with Held(page, stack.url + SETTINGS, "PUT") as held:
            await weight.fill("0.45")
            await page.click("#settings-save")
            first = await held.next()
            await expect(message).to_have_text("Saving…")
            await weight.fill("-1")  # typed while that save runs
            error = page.locator('.field[data-setting="w_keyword"] .field-error')
            await expect(error).to_have_text("must be at least 0")
            # a second save (Save is disabled while one runs; a script can still submit)
            await page.locator("#settings-form").evaluate("form => form.requestSubmit()")
            await expect(message).to_have_text("Not saved: 1 field to fix.")
            read = await answers(page, SETTINGS)
            await first.continue_()
            await answered(page, SETTINGS, read)
        await expect(message).to_have_text("Not saved: 1 field to fix.")
        await expect(weight).to_have_value("-1")
        await expect(error).to_have_text("must be at least 0")
        assert (await settings(stack))["w_keyword"] == 0.45
        await expect(page.locator("#settings-save")).to_be_enabled()
        await weight.fill("0.45")
        await expect(error).to_be_hidden()
        assert not errors, errors


async def test_a_late_memory_answer_keeps_a_typed_importance_and_sync_reports_its_pass(
        browser: Browser, stack: Stack) -> None:
    from playwright.async_api import expect
    saved = await stack.tool("save_memory", content="The backups run at 02:00 UTC.",
                             title="backup window", realm="ops")
    memory_id = saved["node_id"]
    async with page_for(browser) as (page, errors, _):
        await page.add_init_script(COUNT_ANSWERS)
        await log_in(stack, page)
        await page.evaluate("id => { location.hash = '#/memory/' + encodeURIComponent(id); }",
                            memory_id)
        await expect(page.locator("#memory-title")).to_have_text("backup window")
        await expect(page.locator("#memory-status")).to_have_text("active")
        importance = page.locator("#memory-importance")
        await expect(importance).to_have_value("0.5")

        await open_tab(page, "search")
        path = f"/v1/agent/memory/items/{quote(memory_id)}"
        async with Held(page, stack.url + path, "GET") as held:
            await page.click('#tabs a[data-tab="memory"]')  # the same memory, loading again
            load = await held.next()
            await expect(page.locator("#view-memory")).to_be_visible()
            await importance.fill("0.7")  # into the view still shown
            await stack.tool("update_memory_status", memory_id=memory_id, status="archived")
            read = await answers(page, path)
            await load.continue_()
            await answered(page, path, read)
        await expect(page.locator("#memory-status")).to_have_text("archived")  # it landed
        await expect(importance).to_have_value("0.7")  # and kept what was typed
        await page.click("#memory-importance-save")
        await expect(page.locator("#memory-message")).to_have_text("Saved: importance 0.7")
        after = await stack.memory(memory_id)
        assert after["importance"] == 0.7 and after["status"] == "archived", after

        # a pass's report belongs to that pass: opening the view again ends it
        await open_tab(page, "sync")
        await expect(page.locator("#sync-plane")).to_contain_text(stack.hub.url)
        await page.click("#sync-now")
        await expect(page.locator("#sync-message")).to_contain_text("Pass done")
        await open_tab(page, "search")
        await open_tab(page, "sync")
        await expect(page.locator("#sync-message")).to_be_hidden()
        await expect(page.locator('#sync-health [data-key="last_success"] time')).to_have_count(1)
        assert not errors, errors
