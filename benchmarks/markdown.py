"""``web_markdown``: the web chat's Markdown renderer (agentik/web/static/markdown.js) in a real
headless Chromium, on text that opens much and closes nothing (issue 26: once quadratic) and on
ordinary answers. For each pattern, the best of three renderings of 100 kB and of 1 MB, timed in
the page with ``performance.now()`` (DOM nodes built, not laid out). Needs playwright and
Debian's chromium (AGENTIK_CHROMIUM to point elsewhere); every request of the page is answered
from the static directory, nothing goes on the network.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import trio

STATIC = Path(__file__).resolve().parent.parent / "agentik" / "web" / "static"
ORIGIN = "http://127.0.0.1:9"
PATTERNS = {
    "brackets": "[",
    "images": "![",
    "stars": "*a ",
    "underscores": "_x ",
    "lines_of_brackets": "[\n",
    "links": "[a](https://e.x) ",
    "prose": "Some **bold** text, `code` and a [link](https://e.x).\n\n",
    "table_rows": "| a | **b** | c |\n",
}
TIME = """async ([pattern, size]) => {
  const { renderMarkdown } = await import('/agentik/ui/markdown.js');
  const text = pattern.repeat(Math.ceil(size / pattern.length)).slice(0, size);
  let best = Infinity;
  for (let n = 0; n < 3; n++) {
    const start = performance.now();
    renderMarkdown(text);
    best = Math.min(best, performance.now() - start);
  }
  return best;
}"""


def _measure(sizes: list[int]) -> dict[str, Any]:
    from playwright.sync_api import Route, sync_playwright

    chromium = os.environ.get("AGENTIK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"

    def serve(route: Route) -> None:
        name = route.request.url.removeprefix(ORIGIN).removeprefix("/agentik/ui/")
        if name.endswith(".js") and (STATIC / name).is_file():
            route.fulfill(body=(STATIC / name).read_text(), content_type="text/javascript")
        else:
            route.fulfill(body="<!doctype html><title>bench</title>", content_type="text/html")

    row: dict[str, Any] = {"name": "web_markdown"}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.route(f"{ORIGIN}/**", serve)
            page.goto(f"{ORIGIN}/")
            for name, pattern in PATTERNS.items():
                for size in sizes:
                    ms = page.evaluate(TIME, [pattern, size])
                    row[f"{name}_{size // 1000}k_ms"] = round(ms, 1)
        finally:
            browser.close()
    return row


async def web_markdown(quick: bool) -> dict[str, Any]:
    sizes = [100_000] if quick else [100_000, 1_000_000]
    return await trio.to_thread.run_sync(_measure, sizes)
