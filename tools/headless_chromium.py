"""Debian's Chromium, headless and offline, driven by Playwright: what the browser test
(``tools/browser_test.py``) and the website test (``tools/book_test.py``) both launch."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("FLASHTEXT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
    "--disable-dev-shm-usage",
    # nothing but the local server resolves: the book must work offline
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]


@contextlib.contextmanager
def launched() -> Iterator[object]:
    """A Playwright browser on :data:`CHROMIUM`; a test failure that says what is missing if
    the playwright package or the browser is not installed."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the playwright package is missing: `make env` installs it (requirements.txt)")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no chromium at {CHROMIUM}: install Debian's chromium (tools/ci_setup.sh) "
                    "or set FLASHTEXT_CHROMIUM")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                     timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()
