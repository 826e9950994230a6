"""The built-in web chat (issue 15) in a real headless Chromium, driven by playwright's sync API.

The servers (the scripted model, agentik on a real hypercorn, a TCP proxy in front of agentik)
run in the test's trio loop. The browser runs in one dedicated thread for the whole module,
because playwright's sync objects belong to the thread that made them. A test drives it with
``await session.run(step)``: a step is a plain function run in that thread; between steps the
test task changes the world (opens a gate of the scripted model, restarts the server, cuts or
refuses the page's connections at the proxy). Every page is watched: an uncaught error, or a
request to anything but the server, fails the test when its session closes.

The browser: tests/browser.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import pytest
import trio

from agentik.config import Config
from agentik.tools.base import FunctionTools
from tests.browser import SCREENSHOT, WAIT_MS, BrowserThread, browser_for_module, needs_browser
from tests.scripted_openai import Fail, Hang, Reply, ScriptedOpenAI, ToolCalls, open_scripted_openai
from tests.tcp_proxy import TcpProxy, open_tcp_proxy
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    Server,
    make_config,
    no_error_logs,
    open_sse,
    serve_app,
)

#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")

try:
    from playwright.sync_api import (
        Browser,
        BrowserContext,
        Page,
        Request,
        WebSocketRoute,
        expect,
    )
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
except ImportError:  # pragma: no cover - the tests are skipped (tests/browser.py)
    pass

T = TypeVar("T")


@pytest.fixture(scope="module")
def browser_thread() -> Iterator[BrowserThread]:
    yield from browser_for_module()

STATUS = '[data-testid="connection-status"]'
MESSAGES = '[data-testid="message"]:not([data-draft])'
DRAFT = '[data-testid="message"][data-draft]'
ITEMS = '[data-testid="conversation-item"]'
INPUT = '[data-testid="message-input"]'
ASSISTANT = '[data-testid="message"][data-role="assistant"]:not([data-draft])'


@dataclass
class Session:
    """One browser context (its own localStorage) and its pages, all watched."""

    bt: BrowserThread
    base: str
    viewport: dict[str, int] = field(default_factory=lambda: {"width": 1280, "height": 800})
    context: BrowserContext | None = None
    pages: list[Page] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    #: (url, Authorization header) of every fetch to the API
    api_requests: list[tuple[str, str | None]] = field(default_factory=list)
    websockets: list[str] = field(default_factory=list)

    async def run(self, step: Callable[..., T], *args: Any) -> T:
        return await self.bt.call(lambda _browser: step(*args))

    def page(self, path: str = "/") -> Page:
        """(browser thread) A new watched tab at ``path``."""
        assert self.context is not None
        page = self.context.new_page()
        page.on("pageerror", lambda exc: self.errors.append(f"{page.url}: {exc}"))
        page.on("request", self._request)
        page.on("websocket", self._websocket)
        page.goto(self.base + path)
        self.pages.append(page)
        return page

    def _request(self, request: Any) -> None:
        url = request.url
        if not (url.startswith(self.base + "/") or url.startswith("data:")):
            self.outside.append(url)
        elif url.startswith(self.base + "/agentik/") and not url.startswith(
            self.base + "/agentik/ui/"
        ):
            self.api_requests.append((url, request.headers.get("authorization")))

    def _websocket(self, ws: Any) -> None:
        self.websockets.append(ws.url)
        if not ws.url.startswith("ws" + self.base.removeprefix("http") + "/"):
            self.outside.append(ws.url)


@asynccontextmanager
async def open_session(
    bt: BrowserThread, base: str, viewport: dict[str, int] | None = None,
    permissions: list[str] | None = None,
) -> AsyncIterator[Session]:
    session = Session(bt, base)
    if viewport:
        session.viewport = viewport

    def start(browser: Browser) -> None:
        session.context = browser.new_context(viewport=session.viewport,
                                              permissions=permissions or [])
        session.context.set_default_timeout(WAIT_MS)

    await bt.call(start)
    try:
        yield session
    finally:
        ctx = session.context
        if ctx is not None:
            await bt.call(lambda _b: ctx.close())
    assert not session.errors, session.errors
    assert not session.outside, session.outside


# --- the servers ---------------------------------------------------------------------------------


@dataclass
class Stack:
    """Scripted model + agentik (restartable) + the proxy the browser goes through."""

    openai: ScriptedOpenAI
    config: Config
    proxy: TcpProxy
    tools: FunctionTools | None = None
    server: Server | None = None
    http: httpx2.AsyncClient | None = None
    _cm: Any = None

    @property
    def base(self) -> str:
        return self.proxy.url

    @property
    def client(self) -> httpx2.AsyncClient:
        assert self.http is not None
        return self.http

    async def start(self, **changes: Any) -> None:
        if changes:
            self.config = self.config.replace(**changes)
        self._cm = serve_app(self.config, tools=self.tools)
        self.server = await self._cm.__aenter__()
        port = int(self.server.url.rpartition(":")[2])
        self.proxy.retarget("127.0.0.1", port)
        headers = {"Authorization": f"Bearer {self.config.tokens[0]}"} if self.config.tokens else {}
        self.http = httpx2.AsyncClient(base_url=self.server.url, headers=headers, timeout=10)

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.aclose()
            self.http = None
        if self._cm is not None:
            cm, self._cm = self._cm, None
            await cm.__aexit__(None, None, None)

    async def wait_answer(self, cid: str, after: str) -> None:
        """Wait until conversation ``cid`` has an answer (or error) after cursor ``after``."""
        async with open_sse(self.client, f"/agentik/conversations/{cid}/events", after=after) as s:
            with trio.fail_after(10):
                while (await s.next_event()).event not in ("assistant_message", "error"):
                    pass

    async def cursor(self) -> str:
        return str((await self.client.get("/agentik/cursor")).json()["current"])

    async def snapshot_ids(self, cid: str) -> list[str]:
        snap = (await self.client.get(f"/agentik/conversations/{cid}/snapshot")).json()
        return [m["id"] for m in sorted(snap["messages"], key=lambda m: m["seq"])]

    async def conversation_ids(self) -> list[str]:
        body = (await self.client.get("/agentik/conversations")).json()
        return [c["id"] for c in body["conversations"]]


@asynccontextmanager
async def open_stack(
    tmp_path: Path, tools: FunctionTools | None = None, **changes: Any
) -> AsyncIterator[Stack]:
    async with open_scripted_openai() as openai, open_tcp_proxy("127.0.0.1", 9) as proxy:
        stack = Stack(openai, make_config(tmp_path, openai, **changes), proxy, tools)
        await stack.start()
        try:
            yield stack
        finally:
            await stack.stop()


# --- page helpers (browser thread) ---------------------------------------------------------------


def wait_live(page: Page, timeout: float = WAIT_MS) -> None:
    expect(page.locator(STATUS)).to_have_attribute("data-state", "live", timeout=timeout)


def send(page: Page, text: str) -> None:
    page.locator(INPUT).fill(text)
    page.locator(INPUT).press("Enter")
    expect(page.locator(INPUT)).to_have_value("")


def message_keys(page: Page) -> list[str]:
    keys: list[str] = page.locator(MESSAGES).evaluate_all("els => els.map(e => e.dataset.key)")
    return keys


def open_conversation_id(page: Page) -> str:
    m = re.search(r"#/c/([^/]+)$", page.url)
    assert m, page.url
    return m.group(1)


def stats(page: Page) -> dict[str, int]:
    result: dict[str, int] = page.evaluate("() => window.agentik.stats")
    return result


# --- tests: static files (no browser) ------------------------------------------------------------


async def test_the_page_and_its_files_are_served_with_a_strict_policy(tmp_path: Path) -> None:
    async with open_stack(tmp_path, tokens=("tok1",)) as stack:
        async with httpx2.AsyncClient(base_url=stack.server.url if stack.server else "") as c:
            for path in ("/", "/agentik/ui"):
                page = await c.get(path)  # public even with AGENTIK_TOKENS set
                assert page.status_code == 200, path
                assert page.headers["content-type"].startswith("text/html")
                assert 'data-testid="message-input"' in page.text
                policy = page.headers["content-security-policy"]
                assert "script-src 'self'" in policy and "default-src 'none'" in policy
                assert "unsafe-inline" not in policy
            # Nothing the page loads comes from elsewhere.
            assert not re.search(r"""(src|href)=["']?(https?:)?//""", page.text)
            js = await c.get("/agentik/ui/app.js")
            assert js.status_code == 200
            assert js.headers["content-type"].startswith("text/javascript")
            assert (await c.get("/agentik/ui/app.js", headers={"If-None-Match": js.headers["etag"]})
                    ).status_code == 304
            for name in ("style.css", "markdown.js", "inline.js", "sync.js", "store.js", "api.js"):
                assert (await c.get(f"/agentik/ui/{name}")).status_code == 200, name
            missing = await c.get("/agentik/ui/nothing.js")
            assert missing.status_code == 404
            assert missing.json()["error"]["code"] == "not_found"
            assert (await c.get("/agentik/ui/..%2Fui.py")).status_code in (401, 404)
            # The API itself still wants the token.
            assert (await c.get("/agentik/cursor")).status_code == 401


def test_model_text_is_never_given_to_innerHTML() -> None:
    """The page builds DOM nodes from model text; no file of it parses HTML from a string."""
    static = Path(__file__).parent.parent / "agentik" / "web" / "static"
    for path in static.glob("*.js"):
        source = path.read_text()
        sinks = re.findall(
            r"\.(?:inner|outer)HTML\b|insertAdjacentHTML|document\.write|DOMParser"
            r"|createContextualFragment|\beval\(|new Function|srcdoc", source,
        )
        assert not sinks, (path.name, sinks)


# --- tests: in the browser -----------------------------------------------------------------------


@needs_browser
async def test_chat_streams_token_by_token_renders_markdown_and_keeps_history(
    tmp_path: Path, browser_thread: BrowserThread
) -> None:
    gate = trio.Event()
    async with open_stack(tmp_path) as stack, open_session(browser_thread, stack.base) as s:
        stack.openai.push(Reply(
            ["Hello ", "**bold** and *slanted*\n\n- one\n- two\n\n```\ncode <b>x</b>\n```"],
            gate=gate,
        ))

        def start() -> Page:
            page = s.page("/")
            wait_live(page)
            expect(page.locator(ITEMS)).to_have_count(0)
            page.get_by_test_id("new-conversation").click()
            expect(page.locator(ITEMS)).to_have_count(1)
            expect(page.locator(INPUT)).to_be_focused()
            # Shift+Enter is a newline, Enter sends.
            page.locator(INPUT).type("first line")
            page.keyboard.press("Shift+Enter")
            page.locator(INPUT).type("second line")
            expect(page.locator(INPUT)).to_have_value("first line\nsecond line")
            page.keyboard.press("Enter")
            user = page.locator('[data-testid="message"][data-role="user"]')
            expect(user).to_have_count(1)
            expect(user.locator(".msg-text")).to_have_text("first line\nsecond line")
            # The first token is on the page while the model holds the rest back.
            expect(page.locator(DRAFT)).to_contain_text("Hello")
            expect(page.locator(ASSISTANT)).to_have_count(0)
            expect(page.get_by_test_id("stop")).to_be_visible()
            return page

        page = await s.run(start)
        assert stack.openai.requests[-1]["messages"][-1]["content"] == "first line\nsecond line"
        gate.set()

        def finish() -> None:
            answer = page.locator(ASSISTANT)
            expect(answer).to_have_count(1)
            expect(page.locator(DRAFT)).to_have_count(0)
            expect(answer.locator("strong")).to_have_text("bold")
            expect(answer.locator("em")).to_have_text("slanted")
            expect(answer.locator("li")).to_have_text(["one", "two"])
            expect(answer.locator("pre code")).to_have_text("code <b>x</b>")
            expect(answer.locator("b")).to_have_count(0)
            expect(page.get_by_test_id("stop")).to_be_hidden()
            keys = message_keys(page)
            cid = open_conversation_id(page)
            # A reload shows the same history (from the snapshot), once.
            page.reload()
            wait_live(page)
            expect(page.locator(MESSAGES)).to_have_count(2)
            assert message_keys(page) == keys
            assert open_conversation_id(page) == cid
            expect(page.locator(ASSISTANT).locator("strong")).to_have_text("bold")
            expect(page.locator(ITEMS)).to_have_count(1)
            expect(page.locator(ITEMS).locator('[aria-current="page"]')).to_have_count(1)

        await s.run(finish)


@needs_browser
async def test_html_and_script_from_the_model_never_run(
    tmp_path: Path, browser_thread: BrowserThread
) -> None:
    attack = (
        '<img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script> '
        "[click](javascript:window.__pwned=3) ![pic](http://example.invalid/pic.png) "
        '<a href="/x" onclick="window.__pwned=4">a</a> <iframe src="/agentik/cursor"></iframe>'
    )
    tools = FunctionTools()
    tools.add(lambda: attack, name="html", description="returns HTML")
    async with open_stack(tmp_path, tools) as stack, open_session(browser_thread, stack.base) as s:
        stack.openai.push(ToolCalls([("call_1", "html", "{}")]), Reply(attack, chunk_delay=0.01))

        def step() -> None:
            page = s.page("/")
            wait_live(page)
            send(page, f"say {attack}")  # the user's own text too
            expect(page.locator(ASSISTANT)).to_have_count(1)
            tool = page.locator('[data-testid="message"][data-role="tool"]')
            tool.locator("summary").click()
            expect(tool.locator(".tool-result")).to_contain_text("<script>window.__pwned=2")
            answer = page.locator(ASSISTANT)
            expect(answer).to_contain_text('<img src=x onerror="window.__pwned=1">')
            expect(answer).to_contain_text("<script>window.__pwned=2</script>")
            chat = page.locator("#messages")
            assert chat.locator("img, script, iframe, [onclick], [onerror]").count() == 0
            hrefs = chat.locator("a").evaluate_all("els => els.map(a => a.getAttribute('href'))")
            assert all(h.startswith("http://example.invalid/") for h in hrefs), hrefs
            assert page.evaluate("() => window.__pwned") is None
            page.reload()
            wait_live(page)
            expect(page.locator(ASSISTANT)).to_contain_text("<script>")
            assert page.evaluate("() => window.__pwned") is None

        await s.run(step)
        # The page never asked for "x" (the <img src=x>) nor for anything outside (session check).
        assert not [u for u, _ in s.api_requests if u.endswith("/x")]


@needs_browser
async def test_tool_calls_errors_and_stop(tmp_path: Path, browser_thread: BrowserThread) -> None:
    tools = FunctionTools()
    tools.add(lambda a, b: a + b, name="add", description="adds two numbers")
    async with open_stack(tmp_path, tools) as stack, open_session(browser_thread, stack.base) as s:
        stack.openai.push(
            ToolCalls([("call_1", "add", '{"a": 2, "b": 3}')]),
            Reply("The sum is **5**:\n\n1. add `2`\n2. and `3`"),
            Fail(400, "the model refused this"),
            Hang(text_before="partial answer"),
        )

        def tools_and_error() -> Page:
            page = s.page("/")
            wait_live(page)
            send(page, "What is 2 + 3?")
            expect(page.locator(ASSISTANT)).to_contain_text("The sum is 5")
            tool = page.locator('[data-testid="message"][data-role="tool"]')
            expect(tool).to_have_count(1)
            expect(tool).to_have_attribute("data-status", "done")
            expect(tool.locator(".tool-name")).to_have_text("add")
            # Collapsed until opened.
            expect(tool.locator(".tool-result")).to_be_hidden()
            tool.locator("summary").click()
            expect(tool.locator(".tool-result")).to_have_text("5")
            expect(tool.locator(".tool-args")).to_contain_text('"a": 2')
            send(page, "again")
            error = page.locator('[data-testid="message"][data-role="error"]')
            expect(error).to_have_count(1)
            expect(error).to_contain_text("the model refused this")
            send(page, "hang")
            expect(page.locator(DRAFT)).to_contain_text("partial answer")
            return page

        page = await s.run(tools_and_error)
        with trio.fail_after(10):
            await stack.openai.wait_requests(4)  # the Hang step is streaming

        def stop() -> None:
            page.get_by_test_id("stop").click()
            answers = page.locator(ASSISTANT)
            expect(answers).to_have_count(2)
            interrupted = answers.nth(1)
            expect(interrupted).to_have_attribute("data-interrupted", "true")
            expect(interrupted).to_contain_text("partial answer")
            expect(interrupted.locator(".badge")).to_have_text("interrupted")
            expect(page.get_by_test_id("stop")).to_be_hidden()
            expect(page.locator(DRAFT)).to_have_count(0)
            roles = page.locator(MESSAGES).evaluate_all("els => els.map(e => e.dataset.role)")
            assert roles == ["user", "tool", "assistant", "user", "error", "user", "assistant"]
            page.locator('[data-testid="message"][data-role="tool"] summary').click()  # close
            page.locator(INPUT).fill("Try **markdown**, tools and streaming")
            if SCREENSHOT:
                page.screenshot(path=SCREENSHOT)

        await s.run(stop)


TABLE_ANSWER = """Here is the plan:

| step | who | minutes |
|:-----|:---:|--------:|
| write the **tests** | me | 30 |
| fix `it` | you | 5 |

```python
def add(a, b):
    return a + b  # <b>not bold</b>
```
"""


@needs_browser
async def test_a_table_renders_and_a_code_block_copies(
    tmp_path: Path, browser_thread: BrowserThread
) -> None:
    async with open_stack(tmp_path) as stack, open_session(
        browser_thread, stack.base, permissions=["clipboard-read", "clipboard-write"]
    ) as s:
        stack.openai.push(Reply(TABLE_ANSWER))

        def step() -> None:
            page = s.page("/")
            wait_live(page)
            send(page, "a plan, please")
            answer = page.locator(ASSISTANT)
            expect(answer).to_have_count(1)
            expect(page.locator(DRAFT)).to_have_count(0)  # late live chunks made no second one
            table = answer.locator("table")
            expect(table.locator("thead th")).to_have_text(["step", "who", "minutes"])
            expect(table.locator("tbody tr")).to_have_count(2)
            expect(table.locator("tbody tr").first.locator("td")).to_have_text(
                ["write the tests", "me", "30"])
            expect(table.locator("tbody strong")).to_have_text("tests")
            expect(table.locator("tbody code")).to_have_text("it")
            aligns = table.locator("tbody tr").first.locator("td").evaluate_all(
                "tds => tds.map(td => getComputedStyle(td).textAlign)")
            assert aligns == ["left", "center", "right"], aligns
            assert "|" not in answer.inner_text()
            code = "def add(a, b):\n    return a + b  # <b>not bold</b>"
            expect(answer.locator("pre code")).to_have_text(code)
            copy = answer.get_by_test_id("copy-code")
            expect(copy).to_have_text("Copy")
            copy.click()
            expect(copy).to_have_text("Copied")
            assert page.evaluate("() => navigator.clipboard.readText()") == code
            if SCREENSHOT:
                page.screenshot(path=SCREENSHOT.replace(".png", "-table.png"))

        await s.run(step)


#: the longest task the page ran since it was loaded, in ms (Chromium's long tasks: over 50 ms)
LONGEST_TASK = """() => new Promise((resolve) => {
  new PerformanceObserver((list) => {
    resolve(Math.max(0, ...list.getEntries().map((e) => e.duration)));
  }).observe({ type: 'longtask', buffered: true });
  setTimeout(() => resolve(0), 1000);  // no long task at all
})"""


@needs_browser
async def test_a_1_mb_answer_of_brackets_never_freezes_the_page(
    tmp_path: Path, browser_thread: BrowserThread
) -> None:
    """Issue 26: 1 MB of `[` froze a tab for minutes. Opened from the server (the snapshot),
    the page shows it with no task of a second or more (timed by the page: long tasks): the
    renderer is linear, and a long text is shown cut (laying out 1 MB of text alone took the
    browser 0.4 to 1.2 s on a loaded machine), the whole on request."""
    async with open_stack(tmp_path) as stack, open_session(browser_thread, stack.base) as s:
        conv = (await stack.client.post("/agentik/conversations", json={})).json()
        stack.openai.push(Reply(["[" * 1_000_000]))
        after = await stack.cursor()
        await stack.client.post(f"/agentik/conversations/{conv['id']}/messages",
                                json={"content": [{"type": "text", "body": "brackets"}]})
        await stack.wait_answer(conv["id"], after)

        def step() -> float:
            page = s.page(f"/#/c/{conv['id']}")
            wait_live(page)
            answer = page.locator(ASSISTANT)
            expect(answer).to_have_count(1)
            longest: float = page.evaluate(LONGEST_TASK)
            # The first 100,000 characters, then a button for the whole (on request).
            shown = "el => el.textContent.length"
            assert answer.locator(".md").evaluate(shown) == 100_000
            answer.get_by_test_id("show-all").click()
            expect(answer.get_by_test_id("show-all")).to_have_count(0)
            assert answer.locator(".md").evaluate(shown) == 1_000_000
            return longest

        longest = await s.run(step)
        print(f"the longest task: {longest:.0f} ms")
        assert longest < 1000, longest


@needs_browser
async def test_two_tabs_stay_in_step(tmp_path: Path, browser_thread: BrowserThread) -> None:
    gate = trio.Event()
    async with open_stack(tmp_path) as stack, open_session(browser_thread, stack.base) as s:
        stack.openai.push(Reply(["Streaming ", "to both tabs"], gate=gate))

        def start() -> tuple[Page, Page]:
            a = s.page("/")
            b = s.page("/")
            wait_live(a)
            wait_live(b)
            a.get_by_test_id("new-conversation").click()
            expect(b.locator(ITEMS)).to_have_count(1)  # created elsewhere: appears live
            b.locator(ITEMS).first.locator("button").click()
            wait_live(b)
            send(a, "hello from A")
            for tab in (a, b):
                expect(tab.locator('[data-role="user"]')).to_have_text(re.compile("hello from A"))
                expect(tab.locator(DRAFT)).to_contain_text("Streaming")
            return a, b

        a, b = await s.run(start)
        gate.set()

        def rest() -> None:
            for tab in (a, b):
                expect(tab.locator(ASSISTANT)).to_have_text(re.compile("Streaming to both tabs"))
                expect(tab.locator(DRAFT)).to_have_count(0)
            assert message_keys(a) == message_keys(b)
            # Rename in B: A's list and title follow.
            b.get_by_test_id("rename-conversation").click()
            b.get_by_label("Conversation title").fill("Renamed in B")
            b.get_by_label("Conversation title").press("Enter")
            expect(a.locator(ITEMS)).to_have_text(re.compile("Renamed in B"))
            expect(a.locator("#chat-title")).to_have_text("Renamed in B")
            # A second conversation from A appears in B, newest first.
            a.get_by_test_id("new-conversation").click()
            expect(b.locator(ITEMS)).to_have_count(2)
            expect(b.locator(ITEMS).nth(1)).to_contain_text("Renamed in B")
            # B deletes the renamed one (two clicks); A's list drops it.
            b.get_by_test_id("delete-conversation").click()
            b.get_by_test_id("delete-conversation").click()
            expect(b.locator(ITEMS)).to_have_count(1)
            expect(a.locator(ITEMS)).to_have_count(1)
            expect(a.locator(ITEMS)).not_to_contain_text("Renamed in B")

        await s.run(rest)


@needs_browser
async def test_server_restart_reconnects_and_resumes_from_the_cursor(
    tmp_path: Path, browser_thread: BrowserThread
) -> None:
    async with open_stack(tmp_path) as stack, open_session(browser_thread, stack.base) as s:

        def start() -> Page:
            page = s.page("/")
            wait_live(page)
            send(page, "before the restart")
            expect(page.locator(ASSISTANT)).to_have_text(re.compile("echo: before the restart"))
            return page

        page = await s.run(start)
        cid = await s.run(open_conversation_id, page)
        before = await s.run(stats, page)
        await stack.stop()
        stack.proxy.refuse = True  # down: new connections are closed at once
        await stack.proxy.cut_all()

        def down() -> None:
            expect(page.locator(STATUS)).to_have_attribute("data-state", "reconnecting")
            expect(page.locator(STATUS)).to_contain_text(re.compile(r"Reconnecting in \d+ s"))

        await s.run(down)
        # Up again on the same database; another client talks while the page is still away.
        await stack.start()
        after = await stack.cursor()
        await stack.client.post(f"/agentik/conversations/{cid}/messages",
                                json={"content": [{"type": "text", "body": "while away"}]})
        await stack.wait_answer(cid, after)
        stack.proxy.refuse = False

        def back() -> None:
            wait_live(page)  # by itself: a try at least every 3 s while the page is visible
            expect(page.locator(ASSISTANT)).to_have_count(2)
            expect(page.locator(ASSISTANT).nth(1)).to_have_text(re.compile("echo: while away"))
            send(page, "after the restart")
            expect(page.locator(ASSISTANT)).to_have_count(3)

        await s.run(back)
        assert await s.run(message_keys, page) == await stack.snapshot_ids(cid)
        now = await s.run(stats, page)
        # Resumed from its cursors (agent list and chat), not resynced from a snapshot.
        assert now["resyncs"] == before["resyncs"]
        assert now["resumes"] >= before["resumes"] + 2
        assert now["connects"] > before["connects"]


#: make the page hidden or visible as a browser does when its tab is switched
SET_VISIBILITY = """(state) => {
  Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => state });
  const before = window.agentik.stats.tries;
  document.dispatchEvent(new Event('visibilitychange'));
  return window.agentik.stats.tries - before;
}"""
#: the browser says the network is back
ONLINE = """() => {
  const before = window.agentik.stats.tries;
  window.dispatchEvent(new Event('online'));
  return window.agentik.stats.tries - before;
}"""


@needs_browser
async def test_reconnect_tries_every_3_s_while_visible_and_at_once_when_shown_or_online(
    tmp_path: Path, browser_thread: BrowserThread
) -> None:
    async with open_stack(tmp_path) as stack, open_session(browser_thread, stack.base) as s:

        def start() -> Page:
            page = s.page("/")
            wait_live(page)
            send(page, "hello")
            expect(page.locator(ASSISTANT)).to_have_count(1)
            return page

        page = await s.run(start)
        stack.proxy.refuse = True  # the server is unreachable: every try fails at once
        await stack.proxy.cut_all()

        def failed_send() -> None:
            # A send while the server is away says so ...
            page.locator(INPUT).fill("are you there?")
            page.locator(INPUT).press("Enter")
            expect(page.locator("#notice")).to_be_visible()
            expect(page.locator("#notice-text")).to_contain_text("Could not send")
            # ... and the page keeps trying, never waiting over 3 s while it is visible.
            page.wait_for_function("() => window.agentik.stats.tries >= 7", timeout=30_000)
            delays = page.evaluate("() => window.agentik.retryDelays")
            assert max(delays) <= 3000 and len(delays) >= 6, delays
            assert max(delays[4:]) > 2000, delays  # it did back off
            # Hidden, it backs off further: the next wait is long.
            assert page.evaluate(SET_VISIBILITY, "hidden") == 0
            page.wait_for_function("() => window.agentik.retryDelays.at(-1) > 3000",
                                   timeout=10_000)

        await s.run(failed_send)
        stack.proxy.refuse = False

        def shown() -> None:
            # Shown again: it tries at once (not in up to 30 s), goes live, and the notice goes.
            assert page.evaluate(SET_VISIBILITY, "visible") == 1
            wait_live(page)
            expect(page.locator("#notice")).to_be_hidden()
            expect(page.locator(INPUT)).to_have_value("are you there?")  # kept to send again

        await s.run(shown)
        stack.proxy.refuse = True
        await stack.proxy.cut_all()

        def away_again() -> None:
            # (The waits listed still end with the long one of the first time away: wait for a
            # try after this cut before reading them.)
            expect(page.locator(STATUS)).to_have_attribute("data-state", "reconnecting")
            tries = stats(page)["tries"]
            assert page.evaluate(SET_VISIBILITY, "hidden") == 0
            page.wait_for_function(
                "n => window.agentik.stats.tries > n && window.agentik.retryDelays.at(-1) > 3000",
                arg=tries, timeout=15_000)

        await s.run(away_again)
        stack.proxy.refuse = False

        def online() -> None:
            assert page.evaluate(ONLINE) == 1  # the network is back: a try at once
            wait_live(page)
            send(page, "are you there?")
            expect(page.locator(ASSISTANT)).to_have_count(2)

        await s.run(online)


@needs_browser
async def test_network_cut_mid_answer_resumes_and_the_answer_arrives_once(
    tmp_path: Path, browser_thread: BrowserThread
) -> None:
    gate = trio.Event()
    async with open_stack(tmp_path) as stack, open_session(browser_thread, stack.base) as s:
        stack.openai.push(Reply(["The first part, ", "then the rest."], gate=gate))

        def start() -> Page:
            page = s.page("/")
            wait_live(page)
            send(page, "tell me")
            expect(page.locator(DRAFT)).to_contain_text("The first part")
            return page

        page = await s.run(start)
        before = await s.run(stats, page)
        await stack.proxy.cut_all()  # the network drops every connection of the page

        def reconnected() -> None:
            page.wait_for_function("n => window.agentik.stats.connects > n", arg=before["connects"])
            wait_live(page)
            # Live chunks sent meanwhile are gone for good: the draft says so.
            expect(page.locator(DRAFT)).to_contain_text("some of it was missed")

        await s.run(reconnected)
        gate.set()

        def answered() -> None:
            expect(page.locator(ASSISTANT)).to_have_text(
                re.compile("The first part, then the rest."))
            expect(page.locator(DRAFT)).to_have_count(0)
            expect(page.get_by_test_id("stop")).to_be_hidden()

        await s.run(answered)
        cid = await s.run(open_conversation_id, page)
        assert await s.run(message_keys, page) == await stack.snapshot_ids(cid)
        now = await s.run(stats, page)
        assert now["resyncs"] == before["resyncs"] and now["resumes"] >= before["resumes"] + 2


@needs_browser
async def test_a_first_message_waits_for_its_live_stream_and_streams_from_its_first_token(
    tmp_path: Path, browser_thread: BrowserThread
) -> None:
    """Streamed tokens go only to the subscribers present when they are made. A message typed
    on an empty page makes a conversation and opens its live stream over the WebSocket; here
    that subscribe is held on its way (a slow network) until the page sends the message, or for
    a second if it does not: the message must not be sent before the subscribe is in place, or
    the first part of the answer streams to nobody."""
    gate = trio.Event()
    held: list[str] = []
    #: POSTs of a message seen while the live subscribe was held (the race, caught in the act)
    sent_while_held: list[str] = []
    async with open_stack(tmp_path) as stack, open_session(browser_thread, stack.base) as s:
        stack.openai.push(Reply(["The first part, ", "then the rest."], gate=gate))

        def is_send(request: Request) -> bool:
            return request.method == "POST" and request.url.endswith("/messages")

        def route(ws: WebSocketRoute) -> None:
            server = ws.connect_to_server()

            def to_server(message: str | bytes) -> None:
                frame = json.loads(message)
                if frame.get("type") == "subscribe" and frame.get("stream") == "live" and not held:
                    held.append(frame["conversation_id"])
                    assert s.context is not None
                    # A sync playwright wait dispatches the page's other events meanwhile; the
                    # page, in its own process, runs on (a POST it sends reaches the server).
                    try:
                        request = s.context.wait_for_event("request", is_send, timeout=1000)
                        sent_while_held.append(request.url)
                    except PlaywrightTimeoutError:
                        pass  # the page waited for its subscribe, as it must
                server.send(message)

            ws.on_message(to_server)

        def start() -> Page:
            assert s.context is not None
            s.context.route_web_socket(re.compile(r"/agentik/ws"), route)
            page = s.page("/")
            wait_live(page)
            send(page, "tell me")
            assert sent_while_held == []
            expect(page.locator(DRAFT)).to_contain_text("The first part")
            expect(page.locator(DRAFT)).not_to_contain_text("missed")
            return page

        page = await s.run(start)
        assert held == [await s.run(open_conversation_id, page)]
        gate.set()
        await s.run(lambda: expect(page.locator(ASSISTANT)).to_have_text(
            re.compile("The first part, then the rest.")))


@needs_browser
async def test_dead_cursor_resyncs_with_nothing_lost_or_doubled(
    tmp_path: Path, browser_thread: BrowserThread
) -> None:
    async with open_stack(tmp_path, outbox_cap=3) as stack, open_session(
        browser_thread, stack.base
    ) as s:
        other = (await stack.client.post("/agentik/conversations", json={"title": "other"})).json()

        def start() -> Page:
            page = s.page("/")
            wait_live(page)
            expect(page.locator(ITEMS)).to_have_count(1)
            send(page, "one")
            expect(page.locator(ASSISTANT)).to_have_count(1)
            expect(page.locator(ITEMS)).to_have_count(2)
            return page

        page = await s.run(start)
        cid = await s.run(open_conversation_id, page)
        cursors = await s.run(lambda: page.evaluate("() => window.agentik.cursors"))
        before = await s.run(stats, page)
        stack.proxy.refuse = True
        await stack.proxy.cut_all()
        await s.run(lambda: expect(page.locator(STATUS)).to_have_attribute(
            "data-state", "reconnecting"))
        # Meanwhile: more changes than the outbox keeps.
        for text in ("two", "three"):
            after = await stack.cursor()
            await stack.client.post(f"/agentik/conversations/{cid}/messages",
                                    json={"content": [{"type": "text", "body": text}]})
            await stack.wait_answer(cid, after)
        await stack.client.patch(f"/agentik/conversations/{cid}", json={"title": "renamed away"})
        assert (await stack.client.delete(f"/agentik/conversations/{other['id']}")).status_code == 204
        third = (await stack.client.post("/agentik/conversations", json={"title": "third"})).json()
        for cursor in (cursors["agent"], cursors["chat"]):
            dead = await stack.client.get("/agentik/events", params={"after": cursor})
            assert dead.status_code == 410, cursor
        stack.proxy.refuse = False

        def back() -> None:
            page.get_by_test_id("reconnect-now").click()
            wait_live(page)
            expect(page.locator(ASSISTANT)).to_have_count(3)
            expect(page.locator("#chat-title")).to_have_text("renamed away")
            expect(page.locator(ITEMS)).to_have_count(2)

        await s.run(back)
        assert await s.run(message_keys, page) == await stack.snapshot_ids(cid)
        shown = await s.run(
            lambda: page.locator(ITEMS).evaluate_all("els => els.map(e => e.dataset.id)"))
        assert shown == await stack.conversation_ids()
        assert third["id"] in shown and other["id"] not in shown
        now = await s.run(stats, page)
        assert now["gaps"] >= before["gaps"] + 2  # both cursors were dead: never retried
        assert now["resyncs"] >= before["resyncs"] + 2

        # And it goes on live after the resync.
        await s.run(send, page, "four")
        await s.run(lambda: expect(page.locator(ASSISTANT)).to_have_count(4))
        assert await s.run(message_keys, page) == await stack.snapshot_ids(cid)


@needs_browser
async def test_auth_token_is_asked_kept_sent_and_asked_again_on_401(
    tmp_path: Path, browser_thread: BrowserThread
) -> None:
    async with open_stack(tmp_path, tokens=("tok1",)) as stack, open_session(
        browser_thread, stack.base
    ) as s:

        def login() -> Page:
            page = s.page("/")
            expect(page.locator(STATUS)).to_have_attribute("data-state", "auth")
            token = page.get_by_test_id("token-input")
            expect(token).to_be_visible()
            token.fill("wrong")
            token.press("Enter")
            expect(page.locator("#token-message")).to_contain_text("refused")
            expect(token).to_be_visible()
            token.fill("tok1")
            page.get_by_test_id("token-submit").click()
            wait_live(page)
            assert page.evaluate("() => localStorage.getItem('agentik.token')") == "tok1"
            send(page, "hello with a token")
            expect(page.locator(ASSISTANT)).to_have_text(re.compile("echo: hello with a token"))
            # A reload uses the stored token: no question.
            page.reload()
            wait_live(page)
            expect(page.get_by_test_id("token-input")).to_be_hidden()
            expect(page.locator(ASSISTANT)).to_have_count(1)
            return page

        page = await s.run(login)
        authorized = [(u, h) for u, h in s.api_requests if h == "Bearer tok1"]
        assert authorized and all(h in (None, "Bearer wrong", "Bearer tok1") for _, h in
                                  s.api_requests)
        first_good = s.api_requests.index(authorized[0])
        assert all(h == "Bearer tok1" for _, h in s.api_requests[first_good:])
        assert any("access_token=tok1" in url for url in s.websockets)
        # The server's tokens change: the page is refused and asks again.
        await stack.stop()
        await stack.start(tokens=("tok2",))
        await stack.proxy.cut_all()

        def again() -> None:
            token = page.get_by_test_id("token-input")
            expect(token).to_be_visible(timeout=15_000)
            expect(page.locator(STATUS)).to_have_attribute("data-state", "auth")
            token.fill("tok2")
            token.press("Enter")
            wait_live(page)
            expect(page.locator(ASSISTANT)).to_have_count(1)

        await s.run(again)
        assert any("access_token=tok2" in url for url in s.websockets)


@needs_browser
async def test_phone_sized_layout_and_labels(tmp_path: Path, browser_thread: BrowserThread) -> None:
    phone = {"width": 390, "height": 844}
    async with open_stack(tmp_path) as stack, open_session(browser_thread, stack.base, phone) as s:
        await stack.client.post("/agentik/conversations", json={"title": "on the phone"})

        def step() -> None:
            page = s.page("/agentik/ui")
            wait_live(page)
            width = page.evaluate("() => document.documentElement.scrollWidth")
            assert width <= phone["width"], width
            # The list is a drawer behind a labelled toggle.
            expect(page.get_by_test_id("new-conversation")).to_be_hidden()
            toggle = page.get_by_role("button", name="Show conversations")
            expect(toggle).to_have_attribute("aria-expanded", "false")
            toggle.click()
            expect(toggle).to_have_attribute("aria-expanded", "true")
            expect(page.get_by_test_id("new-conversation")).to_be_focused()
            page.locator(ITEMS).first.locator("button").click()
            expect(page.get_by_test_id("new-conversation")).to_be_hidden()
            # Labelled controls, in a sensible focus order.
            box = page.get_by_label("Message", exact=True)
            expect(box).to_have_attribute("data-testid", "message-input")
            expect(page.get_by_role("status")).to_have_text("Live")
            box.focus()
            page.keyboard.press("Tab")
            expect(page.get_by_test_id("send")).to_be_focused()
            send(page, "small screen")
            expect(page.locator(ASSISTANT)).to_be_in_viewport()
            width = page.evaluate("() => document.documentElement.scrollWidth")
            assert width <= phone["width"], width

        await s.run(step)
