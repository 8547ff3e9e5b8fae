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

A page reaching a TLS server whose certificate our test CA signed (WSS) needs
the browser to accept it: `chromium(args=accept_key_of(certificate))` launches
it pinning that certificate's public key.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserType, ConsoleMessage, Page


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
def chromium(args: tuple[str, ...] = ()) -> Iterator[Browser]:
    """A headless Chromium, closed afterwards; `args` are more command-line flags."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright, _launched(playwright.chromium, args) as browser:
        yield browser


@contextlib.contextmanager
def another_chromium(browser: Browser, args: tuple[str, ...] = ()) -> Iterator[Browser]:
    """A second headless Chromium beside `browser` (from the same Playwright:
    a thread runs one at a time), with its own `args`; closed afterwards."""
    with _launched(browser.browser_type, args) as another:
        yield another


@contextlib.contextmanager
def _launched(browser_type: BrowserType, args: tuple[str, ...]) -> Iterator[Browser]:
    executable = shutil.which("chromium")
    assert executable is not None, missing()
    flags = ["--no-sandbox"] if os.geteuid() == 0 else []
    browser = browser_type.launch(executable_path=executable, args=[*flags, *args])
    try:
        yield browser
    finally:
        browser.close()


def accept_key_of(certificate: Path) -> tuple[str, ...]:
    """Chromium flags that accept a TLS server presenting `certificate`'s public
    key, though no CA the browser knows signed it.

    `--ignore-certificate-errors-spki-list` takes base64 SHA-256 hashes of
    SubjectPublicKeyInfo structures: a server with that key is trusted, any
    other certificate is still checked as usual (and a test CA's is refused).
    The hash is the one `openssl x509 -pubkey | openssl pkey -pubin -outform
    der | sha256` gives."""
    public_key = subprocess.run(
        ["openssl", "x509", "-in", str(certificate), "-noout", "-pubkey"],
        check=True,
        capture_output=True,
    ).stdout
    der = subprocess.run(
        ["openssl", "pkey", "-pubin", "-outform", "der"],
        input=public_key,
        check=True,
        capture_output=True,
    ).stdout
    digest = base64.b64encode(hashlib.sha256(der).digest()).decode()
    return (f"--ignore-certificate-errors-spki-list={digest}",)


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
