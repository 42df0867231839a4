"""An untitled memory's page is headed by its text's first line, not "(untitled fact)"
(issue 35)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.web.conftest import Stack
from tests.web.test_browser import log_in, page_for

if TYPE_CHECKING:
    from playwright.async_api import Browser


async def test_an_untitled_memory_is_headed_by_its_first_line(
        browser: Browser, stack: Stack) -> None:
    from playwright.async_api import expect
    saved = await stack.tool("save_memory", content="\nThe backups run at 02:00 UTC.\nThey "
                             "keep 30 days.", realm="ops")
    async with page_for(browser) as (page, errors, _):
        await log_in(stack, page)
        await page.evaluate("id => { location.hash = '#/memory/' + encodeURIComponent(id); }",
                            saved["node_id"])
        await expect(page.locator("#memory-title")).to_have_text(
            "The backups run at 02:00 UTC.")
        await expect(page).to_have_title("The backups run at 02:00 UTC. · syncd")
        assert not errors, errors
