"""Render the built docs site (``site/``) in headless Chromium: the front page and one API
page must show their navigation and log no console error; screenshots are kept in
``site-screenshots/`` as build artifacts (``./run docs --screenshots``).

Chromium is Debian's (``/usr/bin/chromium``, or ``KAW_CHROMIUM``), driven by Playwright
without Playwright's own browser download. The site is served on 127.0.0.1 for the run.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"front": "", "api": "reference/keyed_async_wait/"}


@contextmanager
def serving(folder: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass


def main() -> None:
    from playwright.sync_api import sync_playwright

    site, shots = ROOT / "site", ROOT / "site-screenshots"
    chromium = os.environ.get("KAW_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        sys.exit("no Chromium (install Debian's chromium, or set KAW_CHROMIUM)")
    if not (site / "index.html").is_file():
        sys.exit("no built site: ./run docs first")
    shots.mkdir(exist_ok=True)
    problems: list[str] = []
    with serving(site) as base, sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            for name, path in PAGES.items():
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                errors: list[str] = []
                page.on("console", lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                answer = page.goto(base + path, wait_until="networkidle", timeout=30_000)
                if answer is None or answer.status != 200:
                    problems.append(f"{name}: {base + path} answered {answer.status if answer else 'nothing'}")
                nav_links = page.locator("nav.md-nav a.md-nav__link").count()
                if nav_links < 10:
                    problems.append(f"{name}: navigation has {nav_links} links")
                if not page.locator("article h1").first.is_visible():
                    problems.append(f"{name}: no visible title")
                problems += [f"{name}: console error: {e}" for e in errors]
                page.screenshot(path=str(shots / f"{name}.png"), full_page=False)
                page.close()
        finally:
            browser.close()
    if problems:
        sys.exit("\n".join(problems))
    print(f"docs rendered: {', '.join(PAGES)}; screenshots in {shots.relative_to(ROOT)}/")


if __name__ == "__main__":
    main()
