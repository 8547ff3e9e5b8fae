"""Headless Chromium for page tests: Debian's `chromium` driven by Playwright.

    reason = missing()              # None, or why no browser can run here
    with chromium() as browser:
        page = browser.new_page()
        errors = ConsoleErrors(page)
        page.goto(url)
        ...
        errors.check()              # no console errors, no uncaught exceptions

The browser is the system's (`/usr/bin/chromium`), never one Playwright would
download. As root Chromium cannot sandbox itself, so it then runs with
`--no-sandbox` (the pages are our own, served on loopback).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Page


def missing() -> str | None:
    """Why no browser test can run here (no Playwright, no chromium), or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install playwright)"
    if shutil.which("chromium") is None:
        return "no chromium on PATH (Debian: apt install chromium)"
    return None


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium, closed afterwards."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    assert executable is not None, missing()
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=args)
        try:
            yield browser
        finally:
            browser.close()


class ConsoleErrors:
    """What a page logged as an error, and the exceptions its scripts did not catch.

    `expected` holds fragments of console errors that are part of a test (the
    browser's own line for an answer the page asked for, e.g. a 401)."""

    def __init__(self, page: Page, expected: tuple[str, ...] = ()) -> None:
        self.expected = expected
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error" and not any(e in message.text for e in self.expected):
            where = message.location.get("url", "")
            self.errors.append(f"{message.text} ({where})")

    def check(self) -> None:
        assert self.errors == [], "errors in the browser console:\n" + "\n".join(self.errors)
