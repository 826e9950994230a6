"""Chromium for the browser tests (tests/test_web_ui.py, tests/test_web_modules.py): one
headless Chromium in a thread of its own per test module, driven by playwright's sync API
(its objects belong to the thread that made them); a test awaits ``browser_thread.call(fn)``.

Needs Debian's ``chromium`` and the ``playwright`` package (no browser download). Without them
the browser tests are skipped, except under CI, where they fail.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import shutil
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import trio

try:
    from playwright.sync_api import Browser, expect, sync_playwright
except ImportError:  # pragma: no cover - reported by the skip below
    sync_playwright = None

T = TypeVar("T")

CHROMIUM = os.environ.get("AGENTIK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
#: a step that takes longer than this has hung (playwright's own timeouts are shorter)
STEP_TIMEOUT = 40.0
#: how long playwright waits for a condition
WAIT_MS = 10_000
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
#: set to a path (e.g. docs/ui.png) to save the screenshots the web chat tests take
SCREENSHOT = os.environ.get("AGENTIK_UI_SCREENSHOT")


def _browser_missing() -> str | None:
    if sync_playwright is None:
        return "the playwright package is not installed (pip install playwright)"
    if not os.path.exists(CHROMIUM):
        return f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
    return None


MISSING = _browser_missing()
if MISSING is None:
    expect.set_options(timeout=WAIT_MS)
needs_browser = pytest.mark.skipif(
    MISSING is not None and not IN_CI, reason=f"the web chat tests need a browser: {MISSING}"
)

# --- the browser thread --------------------------------------------------------------------------


class BrowserThread:
    """Chromium in a thread of its own; ``await call(fn)`` runs ``fn(browser)`` there."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[Any], Any], concurrent.futures.Future[Any]] | None]
        self._jobs = queue.Queue()
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._main, name="playwright", daemon=True)
        self._thread.start()
        self._ready.result(timeout=60)  # a launch failure is raised here

    def _main(self) -> None:
        try:
            assert sync_playwright is not None, MISSING
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                self._ready.set_result(None)
                while (job := self._jobs.get()) is not None:
                    fn, future = job
                    if not future.set_running_or_notify_cancel():
                        continue
                    try:
                        future.set_result(fn(browser))
                    except BaseException as exc:
                        future.set_exception(exc)
                browser.close()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)

    async def call(self, fn: Callable[[Browser], T]) -> T:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, future))
        return await trio.to_thread.run_sync(future.result, STEP_TIMEOUT, abandon_on_cancel=True)

    def call_blocking(self, fn: Callable[[Browser], T]) -> T:
        """``call`` for a synchronous fixture."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, future))
        return future.result(STEP_TIMEOUT)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(30)


def browser_for_module() -> Iterator[BrowserThread]:
    """The body of each browser test module's ``browser_thread`` fixture (scope module)."""
    if MISSING is not None:
        pytest.fail(f"CI must run the browser tests, but {MISSING}")
    bt = BrowserThread()
    try:
        yield bt
    finally:
        bt.close()
