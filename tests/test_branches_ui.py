"""Issue 32: branches in the web chat, in real headless Chromium: regenerate the last answer
three times (four versions; the arrows move between them and the page follows the server's
current branch), and edit a user message (a new version with its own answer; the arrows bring
the old one back)."""

# ruff: noqa: F811 - pytest fixtures imported from other test modules are parameters here

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser import BrowserThread, needs_browser
from tests.scripted_openai import Echo
from tests.test_web_ui import (  # noqa: F401 - the fixture is used by name
    ASSISTANT,
    ITEMS,
    MESSAGES,
    browser_thread,
    open_conversation_id,
    open_session,
    open_stack,
    send,
    wait_live,
)
from tests.webutil import no_error_logs  # noqa: F401 - fixture used by name

try:
    from playwright.sync_api import Page, expect
except ImportError:  # pragma: no cover - the tests are skipped (tests/browser.py)
    pass

pytestmark = pytest.mark.usefixtures("engine")

USER = '[data-testid="message"][data-role="user"]'


@needs_browser
async def test_regenerate_three_times_and_move_between_the_four_answers(
    tmp_path: Path, browser_thread: BrowserThread
) -> None:
    async with open_stack(tmp_path) as stack, open_session(browser_thread, stack.base) as s:
        for n in range(4):
            stack.openai.push(Echo(prefix=f"answer {n}: "))

        def ask() -> Page:
            page = s.page("/")
            wait_live(page)
            page.get_by_test_id("new-conversation").click()
            expect(page.locator(ITEMS)).to_have_count(1)
            send(page, "tell me")
            expect(page.locator(ASSISTANT)).to_contain_text("answer 0: tell me")
            expect(page.get_by_test_id("version-label")).to_have_count(0)  # one version
            for n in (1, 2, 3):
                page.get_by_test_id("regenerate").click()
                expect(page.locator(ASSISTANT)).to_have_count(1)
                expect(page.locator(ASSISTANT)).to_contain_text(f"answer {n}: tell me")
                expect(page.get_by_test_id("version-label")).to_have_text(f"{n + 1} / {n + 1}")
            expect(page.locator(MESSAGES)).to_have_count(2)  # the question and one answer
            return page

        page = await s.run(ask)
        cid = await s.run(lambda: open_conversation_id(page))
        versions = (await stack.client.get(
            f"/agentik/conversations/{cid}/messages")).json()[-1]
        assert (versions["siblings"], versions["sibling_index"]) == (4, 3)

        def browse() -> None:
            label = page.get_by_test_id("version-label")
            expect(page.get_by_test_id("version-next")).to_be_disabled()
            for n in (2, 1, 0):
                page.get_by_test_id("version-prev").click()
                expect(label).to_have_text(f"{n + 1} / 4")
                expect(page.locator(ASSISTANT)).to_contain_text(f"answer {n}: tell me")
            expect(page.get_by_test_id("version-prev")).to_be_disabled()
            page.get_by_test_id("version-next").click()
            expect(label).to_have_text("2 / 4")
            expect(page.locator(ASSISTANT)).to_contain_text("answer 1: tell me")
            # the server's current branch is the one shown: a reload shows it again
            page.reload()
            wait_live(page)
            expect(page.get_by_test_id("version-label")).to_have_text("2 / 4")
            expect(page.locator(ASSISTANT)).to_contain_text("answer 1: tell me")

        await s.run(browse)
        # the model goes on from the version shown
        stack.openai.default = Echo(prefix="then: ")
        await s.run(lambda: send(page, "and more"))
        await s.run(lambda: expect(page.locator(ASSISTANT)).to_have_count(2))
        seen = [m["content"] for m in stack.openai.requests[-1]["messages"][1:]]
        assert seen == ["tell me", "answer 1: tell me", "and more"]


@needs_browser
async def test_edit_a_message_then_go_back_to_the_first_version(
    tmp_path: Path, browser_thread: BrowserThread
) -> None:
    async with open_stack(tmp_path) as stack, open_session(browser_thread, stack.base) as s:
        stack.openai.default = Echo(prefix="re: ")

        def edit() -> None:
            page = s.page("/")
            wait_live(page)
            page.get_by_test_id("new-conversation").click()
            send(page, "one")
            expect(page.locator(ASSISTANT)).to_contain_text("re: one")
            send(page, "two")
            expect(page.locator(ASSISTANT)).to_have_count(2)
            page.locator(USER).nth(0).get_by_test_id("edit").click()
            page.get_by_test_id("edit-input").fill("uno")
            page.get_by_test_id("edit-save").click()
            expect(page.locator(ASSISTANT)).to_have_count(1)
            expect(page.locator(ASSISTANT)).to_contain_text("re: uno")
            expect(page.locator(USER)).to_have_count(1)
            user = page.locator(USER)
            expect(user.get_by_test_id("version-label")).to_have_text("2 / 2")
            user.get_by_test_id("version-prev").click()
            expect(page.locator(USER)).to_have_count(2)
            expect(page.locator(USER).nth(0)).to_contain_text("one")
            expect(page.locator(ASSISTANT).nth(1)).to_contain_text("re: two")
            expect(page.locator(USER).nth(0).get_by_test_id("version-label")).to_have_text("1 / 2")

        await s.run(edit)
