"""Issue 30 in the built-in web chat, in a real headless Chromium (tests/browser.py, the helpers
of tests/test_web_ui.py): the approval card (the tool, its arguments, Approve / Deny with a
reason) and the question card (the question, its choices as buttons, a text box), shown from
the events and, after a reload, from the snapshot; gone once answered, by this page or by
another client; a tool server's form (an MCP elicitation)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from agentik.tools.base import FunctionTools
from tests.browser import BrowserThread, browser_for_module, needs_browser
from tests.scripted_openai import Reply, ToolCalls
from tests.test_elicitation import TOOLBOX
from tests.test_web_ui import (
    ASSISTANT,
    open_conversation_id,
    open_session,
    open_stack,
    send,
    wait_live,
)

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")

try:
    from playwright.sync_api import Page, expect
except ImportError:  # pragma: no cover - the tests are skipped (tests/browser.py)
    pass

APPROVAL = '[data-testid="approval-card"]'
QUESTION = '[data-testid="question-card"]'
OUTCOME = '[data-testid="pause-outcome"]'


@pytest.fixture(scope="module")
def browser_thread() -> Iterator[BrowserThread]:
    yield from browser_for_module()


def tool_messages(body: dict[str, object]) -> list[str]:
    """The tool results a model request carried."""
    return [str(m["content"]) for m in body["messages"]  # type: ignore[attr-defined]
            if m["role"] == "tool"]


@needs_browser
async def test_deny_with_a_reason_then_approve_after_a_reload(
    tmp_path: Path, browser_thread: BrowserThread
) -> None:
    runs: list[str] = []
    tools = FunctionTools()
    tools.add(lambda path: runs.append(path) or f"deleted {path}", name="delete_file",
              parameters={"type": "object", "properties": {"path": {"type": "string"}}})
    async with open_stack(tmp_path, tools, approval=("delete_*",)) as stack, \
            open_session(browser_thread, stack.base) as s:
        stack.openai.push(
            ToolCalls([("call_1", "delete_file", '{"path": "a.txt"}')]),
            Reply("Kept it."),
            ToolCalls([("call_2", "delete_file", '{"path": "b.txt"}')]),
            Reply("Deleted b.txt."),
        )

        def deny() -> Page:
            page = s.page("/")
            wait_live(page)
            send(page, "delete a.txt")
            card = page.locator(APPROVAL)
            expect(card).to_be_visible()
            expect(card.locator(".tool-name")).to_have_text("delete_file")
            expect(card.locator(".tool-args")).to_contain_text('"path": "a.txt"')
            tool = page.locator('[data-testid="message"][data-role="tool"]')
            expect(tool).to_have_attribute("data-status", "waiting")
            card.get_by_test_id("deny-reason").fill("it is my thesis")
            card.get_by_test_id("deny").click()
            expect(card).to_have_count(0)
            expect(page.locator(OUTCOME)).to_have_text("Denied: delete_file (it is my thesis)")
            expect(page.locator(ASSISTANT)).to_contain_text(["Kept it."])
            send(page, "then b.txt")
            expect(page.locator(APPROVAL)).to_contain_text("b.txt")
            return page

        page = await s.run(deny)
        assert runs == []
        assert tool_messages(stack.openai.requests[1]) == [
            "the user refused this call: it is my thesis"]

        def reload_and_approve() -> None:
            page.reload()  # the card comes back from the snapshot
            wait_live(page)
            card = page.locator(APPROVAL)
            expect(card).to_contain_text("b.txt")
            card.get_by_test_id("approve").click()
            expect(card).to_have_count(0)
            expect(page.locator(OUTCOME).nth(1)).to_have_text("Approved: delete_file")
            expect(page.locator(ASSISTANT).nth(1)).to_contain_text("Deleted b.txt.")
            tool = page.locator('[data-testid="message"][data-role="tool"]').nth(1)
            expect(tool).to_have_attribute("data-status", "done")

        await s.run(reload_and_approve)
        assert runs == ["b.txt"]
        assert tool_messages(stack.openai.requests[3])[-1] == "deleted b.txt"


@needs_browser
async def test_a_question_answered_here_and_one_answered_elsewhere(
    tmp_path: Path, browser_thread: BrowserThread
) -> None:
    async with open_stack(tmp_path, ask_user=True) as stack, \
            open_session(browser_thread, stack.base) as s:
        ask = json.dumps({"question": "Which file?", "choices": ["a.txt", "b.txt"]})
        stack.openai.push(
            ToolCalls([("q1", "ask_user", ask)]),
            Reply("Using c.txt."),
            ToolCalls([("q2", "ask_user", json.dumps({"question": "Sure?"}))]),
            Reply("Fine."),
        )

        def answer_here() -> Page:
            page = s.page("/")
            wait_live(page)
            send(page, "clean up")
            card = page.locator(QUESTION)
            expect(card.locator(".pause-title")).to_have_text("Which file?")
            expect(card.get_by_test_id("choice")).to_have_text(["a.txt", "b.txt"])
            card.get_by_test_id("answer-input").fill("c.txt")
            card.get_by_test_id("answer-input").press("Enter")
            expect(card).to_have_count(0)
            expect(page.locator(OUTCOME)).to_have_text("Answered: c.txt")
            expect(page.locator(ASSISTANT)).to_contain_text(["Using c.txt."])
            send(page, "and now?")
            expect(page.locator(QUESTION)).to_contain_text("Sure?")
            return page

        page = await s.run(answer_here)
        assert tool_messages(stack.openai.requests[1]) == ["c.txt"]
        cid = await s.run(open_conversation_id, page)
        with trio.fail_after(10):
            answered = await stack.client.post(f"/agentik/conversations/{cid}/inputs/q2",
                                               json={"text": "yes"})
        assert answered.status_code == 200

        def gone() -> None:
            expect(page.locator(QUESTION)).to_have_count(0)
            expect(page.locator(OUTCOME).nth(1)).to_have_text("Answered: yes")
            expect(page.locator(ASSISTANT).nth(1)).to_contain_text("Fine.")

        await s.run(gone)


@needs_browser
async def test_a_tool_servers_form_is_filled_in_the_page(
    tmp_path: Path, browser_thread: BrowserThread
) -> None:
    """An MCP elicitation (tests/mcp_servers/toolbox.py ``book``) as a form: one field per
    property of its schema; Send gives the structured answer, which the server accepts."""
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps({"mcpServers": {"toolbox": {
        "command": sys.executable, "args": [TOOLBOX]}}}))
    async with open_stack(tmp_path, mcp_config=str(mcp)) as stack, \
            open_session(browser_thread, stack.base) as s:
        stack.openai.push(ToolCalls([("b1", "toolbox__book", '{"city": "Oslo"}')]),
                          Reply("Booked."))
        assert stack.server is not None
        tools = stack.server.agent.tools  # the MCP server starts as a process of its own
        with trio.fail_after(30):
            await tools.wait_until(lambda: bool(tools.specs()))

        def fill_in() -> None:
            page = s.page("/")
            wait_live(page)
            send(page, "book Oslo")
            card = page.locator(QUESTION)
            expect(card.locator(".pause-title")).to_have_text("How many nights in Oslo?")
            expect(card.get_by_test_id("answer-input")).to_have_count(0)  # a form instead
            card.get_by_test_id("field-nights").fill("2")
            card.get_by_test_id("field-late").check()
            card.get_by_test_id("answer-send").click()
            expect(card).to_have_count(0)
            expect(page.locator(OUTCOME)).to_have_text('Answered: {"nights":2,"late":true}')
            expect(page.locator(ASSISTANT)).to_contain_text("Booked.")

        await s.run(fill_in)
        assert tool_messages(stack.openai.requests[1]) == [
            "booked 2 nights in Oslo, late=True"]
