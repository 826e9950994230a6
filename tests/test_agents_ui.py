"""Issue 28: the web chat on a server with several agents, in real headless Chromium: a new
conversation is for the agent picked (its model answers), the list names each conversation's
agent; with one agent the picker is hidden and the list names none."""

# ruff: noqa: F811 - pytest fixtures imported from other test modules are parameters here

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentik.config import Config
from tests.browser import BrowserThread, needs_browser
from tests.scripted_openai import Reply, ScriptedOpenAI, open_scripted_openai
from tests.test_agents import two_agents
from tests.test_web_ui import (  # noqa: F401 - the fixture is used by name
    ASSISTANT,
    INPUT,
    ITEMS,
    browser_thread,
    open_session,
    send,
    wait_live,
)
from tests.webutil import no_error_logs, serve_app  # noqa: F401 - fixture used by name

try:
    from playwright.sync_api import Page, expect
except ImportError:  # pragma: no cover - the tests are skipped (tests/browser.py)
    pass

PICKER = '[data-testid="agent-picker"]'
AGENT_TAG = '[data-testid="conversation-agent"]'


@pytest.fixture
async def models() -> AsyncIterator[tuple[ScriptedOpenAI, ScriptedOpenAI]]:
    async with open_scripted_openai() as a, open_scripted_openai() as b:
        yield a, b


@needs_browser
async def test_a_new_conversation_is_for_the_agent_picked(
    tmp_path: Path, browser_thread: BrowserThread, models: tuple[ScriptedOpenAI, ScriptedOpenAI]
) -> None:
    a, b = models
    a.push(Reply("support answers"))
    async with serve_app(two_agents(tmp_path, a, b)) as srv, \
            open_session(browser_thread, srv.url) as s:

        def pick_and_talk() -> Page:
            page = s.page("/")
            wait_live(page)
            picker = page.locator(PICKER)
            expect(picker).to_be_visible()
            expect(picker.locator("option")).to_have_text(["Support", "Coder"])
            expect(picker).to_have_value("coder")  # the default agent
            picker.select_option("support")
            page.get_by_test_id("new-conversation").click()
            expect(page.locator(ITEMS)).to_have_count(1)
            expect(page.locator(INPUT)).to_be_focused()
            send(page, "hello support")
            expect(page.locator(ASSISTANT)).to_contain_text("support answers")
            expect(page.locator(ITEMS).locator(AGENT_TAG)).to_have_text("Support")
            return page

        await s.run(pick_and_talk)
        listed = await srv.agent.conversations_snapshot()
    assert [c.agent for c in listed.conversations] == ["support"]
    assert [r["messages"][-1]["content"] for r in a.requests] == ["hello support"]
    assert a.requests[0]["messages"][0]["content"] == "You are support." and not b.requests


@needs_browser
async def test_with_one_agent_there_is_no_picker(
    tmp_path: Path, browser_thread: BrowserThread, models: tuple[ScriptedOpenAI, ScriptedOpenAI]
) -> None:
    a, _ = models
    config = Config(db_path=str(tmp_path / "agentik.db"), openai_base_url=a.base_url,
                    openai_api_key="x", llm_max_retries=0, sqlite_synchronous="NORMAL")
    async with serve_app(config) as srv, open_session(browser_thread, srv.url) as s:

        def talk() -> None:
            page = s.page("/")
            wait_live(page)
            page.get_by_test_id("new-conversation").click()
            send(page, "hi")
            expect(page.locator(ASSISTANT)).to_contain_text("echo: hi")
            expect(page.locator(PICKER)).to_be_hidden()
            expect(page.locator(ITEMS).locator(AGENT_TAG)).to_have_count(0)

        await s.run(talk)
