"""Issue 29: the web chat with a users file, in real headless Chromium: each user's page asks
for a token, lists that user's conversations only (made over HTTP and from the page), and a live
event of another user's conversation never reaches it."""

# ruff: noqa: F811 - pytest fixtures imported from other test modules are parameters here

from __future__ import annotations

import re
from pathlib import Path

import httpx2
import trio

from tests.browser import BrowserThread, needs_browser
from tests.scripted_openai import ScriptedOpenAI
from tests.test_web_ui import (  # noqa: F401 - the fixture is used by name
    ASSISTANT,
    ITEMS,
    STATUS,
    Session,
    browser_thread,
    open_session,
    send,
    wait_live,
)
from tests.usersutil import TOKENS, bearer, write_users
from tests.webutil import make_config, no_error_logs, openai, serve_app  # noqa: F401

try:
    from playwright.sync_api import Page, expect
except ImportError:  # pragma: no cover - the tests are skipped (tests/browser.py)
    pass


def log_in(s: Session, user: str) -> Page:
    """(browser thread) A page of ``s`` that asks for a token and gets ``user``'s."""
    page = s.page("/")
    expect(page.locator(STATUS)).to_have_attribute("data-state", "auth")
    page.get_by_test_id("token-input").fill(TOKENS[user])
    page.get_by_test_id("token-submit").click()
    wait_live(page)
    return page


def titles(page: Page) -> list[str]:
    found: list[str] = page.locator(f"{ITEMS} .conv-title").all_text_contents()
    return found


def talk(page: Page, text: str) -> None:
    """(browser thread) A new conversation from the page, and one answered send in it."""
    count = page.locator(ITEMS).count()
    page.get_by_test_id("new-conversation").click()
    expect(page.locator(ITEMS)).to_have_count(count + 1)
    send(page, text)
    expect(page.locator(ASSISTANT)).to_have_text(re.compile(f"echo: {text}"))


@needs_browser
async def test_each_users_page_shows_their_conversations_only(
    tmp_path: Path, browser_thread: BrowserThread, openai: ScriptedOpenAI
) -> None:
    users = write_users(tmp_path / "users.toml")
    config = make_config(tmp_path, openai, users_file=str(users))
    async with serve_app(config) as srv, \
            httpx2.AsyncClient(base_url=srv.url, headers=bearer("alice"), timeout=10) as alice, \
            httpx2.AsyncClient(base_url=srv.url, headers=bearer("bob"), timeout=10) as bob, \
            open_session(browser_thread, srv.url) as sa, \
            open_session(browser_thread, srv.url) as sb:
        with trio.fail_after(60):
            for client, title in ((alice, "alice over http"), (bob, "bob over http")):
                made = await client.post("/agentik/conversations", json={"title": title})
                assert made.status_code == 201, made.text

            def open_pages() -> tuple[Page, Page]:
                pa, pb = log_in(sa, "alice"), log_in(sb, "bob")
                expect(pa.locator(ITEMS)).to_have_count(1)
                expect(pb.locator(ITEMS)).to_have_count(1)
                assert titles(pa) == ["alice over http"], titles(pa)
                assert titles(pb) == ["bob over http"], titles(pb)
                talk(pa, "from alice page")
                talk(pb, "from bob page")
                expect(pa.locator(ITEMS)).to_have_count(2)
                expect(pb.locator(ITEMS)).to_have_count(2)
                return pa, pb

            pa, pb = await sa.run(open_pages)
            # Live: bob makes, renames and talks in a conversation while alice's page is open,
            # then alice makes one; her page shows hers (after bob's, on the one cursor) and
            # never bob's.
            cid = (await bob.post("/agentik/conversations", json={"title": "bob live"})).json()["id"]
            renamed = await bob.patch(f"/agentik/conversations/{cid}", json={"title": "bob renamed"})
            assert renamed.status_code == 200, renamed.text
            sent = await bob.post(f"/agentik/conversations/{cid}/messages",
                                  json={"content": [{"type": "text", "body": "bob speaks"}]})
            assert sent.status_code == 202, sent.text

            def bob_sees_his() -> None:
                expect(pb.locator(ITEMS)).to_have_count(3)
                expect(pb.locator(f"{ITEMS} .conv-title").first).to_have_text("bob renamed")

            await sb.run(bob_sees_his)
            made = await alice.post("/agentik/conversations", json={"title": "alice live"})
            assert made.status_code == 201, made.text

            def alice_sees_hers_only() -> list[str]:
                expect(pa.locator(f"{ITEMS} .conv-title").first).to_have_text("alice live")
                expect(pa.locator(ITEMS)).to_have_count(3)
                return titles(pa)

            shown = await sa.run(alice_sees_hers_only)
            assert not [t for t in shown if "bob" in t], shown
            assert "bob speaks" not in await sa.run(lambda: pa.content())
            listed = (await alice.get("/agentik/conversations")).json()["conversations"]
            assert len(listed) == len(shown) == 3
