"""The web page's versions (issue 32, point 2), in headless Chromium against a real daemon: a
memory's view lists its versions (the current one first, a conflict marked), the Sync view
lists the conflicts with Restore and Dismiss, and a restore there makes the lost text current.

The conflict is made as another laptop's would arrive: a concurrent version imported through
the daemon's own ``import`` (written over the memory's first version, not its second), which
wins last-writer-wins and leaves the daemon's edit as the conflict."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from protocol.timestamp import format_ns, parse_ns
from tests.web.conftest import Stack
from tests.web.test_browser import log_in, page_for, quote

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

FIRST, MINE, THEIRS = ("the build runs on make", "the build runs on just",
                       "the build runs on bazel")


async def conflicted(stack: Stack) -> tuple[str, list[dict[str, Any]]]:
    saved = await stack.tool("save_memory", content=FIRST, topic_key="build", realm="infra")
    await stack.tool("save_memory", content=MINE, topic_key="build", realm="infra")
    mid = saved["node_id"]
    versions = (await stack.ok("GET", f"/v1/agent/memory/items/{mid}/versions"))["versions"]
    current, first = versions
    memory = await stack.memory(mid)
    theirs = {"id": mid, "labels": "Memory", "realm": "infra", "memory_type": "fact",
              "content": THEIRS, "importance": 0.5, "status": "active",
              "created_at": memory["created_at"], "valid_at": memory["valid_at"],
              "topic_key": "build", "origin": "0ther1aptop",
              "updated_at": format_ns(parse_ns(current["updated_at"]) + 10**9),
              "base": first["updated_at"]}
    answer = await stack.ok("POST", "/v1/agent/memory/import", {"memory_nodes": [theirs]})
    assert answer["applied_nodes"] == 1, answer
    status = await stack.ok("GET", "/v1/agent/sync/status")
    assert status["conflicts"] == 1, status  # non-vacuity: the daemon kept its edit
    return mid, (await stack.ok("GET", f"/v1/agent/memory/items/{mid}/versions"))["versions"]


async def open_hash(page: Page, fragment: str) -> None:
    await page.evaluate("(h) => { location.hash = h; }", fragment)


async def test_versions_and_conflicts_on_the_page(browser: Browser, stack: Stack) -> None:
    from playwright.async_api import expect
    mid, versions = await conflicted(stack)
    assert [v["reason"] for v in versions] == ["current", "conflict", "replaced"]
    conflict = versions[1]
    async with page_for(browser) as (page, errors, dialogs):
        await log_in(stack, page)
        await open_hash(page, "#/memory/" + quote(mid))
        rows = page.locator("#versions-body table.versions tbody tr")
        await expect(rows).to_have_count(3)
        await expect(rows.nth(0)).to_contain_text(THEIRS)
        await expect(rows.nth(0)).to_contain_text("current")
        await expect(rows.nth(1)).to_contain_text(MINE)
        await expect(rows.nth(1)).to_contain_text("conflict")
        await expect(rows.nth(2)).to_contain_text(FIRST)
        await expect(rows.nth(1).locator("button.version-dismiss")).to_have_count(1)
        await expect(rows.nth(2).locator("button.version-dismiss")).to_have_count(0)

        await page.click('#tabs a[data-tab="sync"]')
        card = page.locator("#sync-conflicts")
        await expect(card.locator("h2")).to_contain_text("1")
        await expect(card.locator("tbody tr")).to_have_count(1)
        await expect(card.locator("tbody tr")).to_contain_text(MINE)
        await card.locator(f'button.version-restore[data-n="{conflict["n"]}"]').click()
        await expect(page.locator("#conflicts-message")).to_contain_text(
            f"Restored version {conflict['n']}")
        await expect(card.locator("tbody tr")).to_have_count(0)
        await expect(card.locator("h2")).to_contain_text("none")

        assert (await stack.memory(mid))["content"] == MINE
        assert (await stack.ok("GET", "/v1/agent/sync/status"))["conflicts"] == 0
        await open_hash(page, "#/memory/" + quote(mid))
        await expect(page.locator("#memory-content")).to_have_text(MINE)
        await expect(rows.nth(0)).to_contain_text("current")
        await expect(rows.nth(1)).to_contain_text(THEIRS)  # the restore replaced theirs
        assert not dialogs, dialogs
        assert not errors, errors


async def test_a_dismiss_on_the_memory_view_keeps_the_current_text(
        browser: Browser, stack: Stack) -> None:
    from playwright.async_api import expect
    mid, versions = await conflicted(stack)
    async with page_for(browser) as (page, errors, _):
        await log_in(stack, page)
        await open_hash(page, "#/memory/" + quote(mid))
        button = page.locator(f'button.version-dismiss[data-n="{versions[1]["n"]}"]')
        await button.click()
        await expect(page.locator("#memory-message")).to_contain_text("Dismissed conflict")
        await expect(page.locator("#versions-body tbody tr").nth(1)).to_contain_text(
            "reviewed")
        await expect(page.locator("button.version-dismiss")).to_have_count(0)
        assert (await stack.memory(mid))["content"] == THEIRS
        assert (await stack.ok("GET", "/v1/agent/sync/status"))["conflicts"] == 0
        assert not errors, errors
