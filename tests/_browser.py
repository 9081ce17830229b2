"""The headless Chromium that the browser tests drive (tests/test_site.py, tests/test_lab_student.py).

:func:`find_browser` looks, in order, for Playwright's own Chromium; then tries
``python -m playwright install chromium`` (needs internet; once per test run); then a system Chromium or
Chrome. :func:`launch` starts it, or skips the test with one line that says how to get one, unless
``REQUIRE_BROWSER=1`` (set by `.ci/run`), which makes a missing browser a failure. The ``browser``
fixture in tests/conftest.py uses :func:`launch`.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_BROWSERS = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable",
                   "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
                   "/Applications/Chromium.app/Contents/MacOS/Chromium")
HOW_TO_GET_ONE = ("no browser for the browser tests: run `.venv/bin/python -m playwright install chromium` "
                  "(needs internet), or install Chromium (Debian/Ubuntu: `sudo apt-get install chromium`; "
                  "macOS: `brew install --cask chromium`)")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def _playwright_chromium() -> str | None:
    """The path of Playwright's own Chromium if it is installed, else None."""
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as pw:
            path = pw.chromium.executable_path
    except Exception:  # noqa: BLE001  (no driver, no browser registry: treat as not installed)
        return None
    return path if path and os.access(path, os.X_OK) else None


def _system_browser() -> str | None:
    import shutil

    for name in SYSTEM_BROWSERS:
        path = name if os.path.isabs(name) else shutil.which(name)
        if path and os.access(path, os.X_OK):
            return path
    return None


def find_browser() -> tuple[str | None, str]:
    """(executable, how it was found), or (None, why not). Tries, in order: Playwright's Chromium;
    ``playwright install chromium`` (once per test run, under a lock, with a time limit);
    a system Chromium or Chrome."""
    import fcntl
    import subprocess
    import sys

    path = _playwright_chromium()
    if path:
        return path, "Playwright's Chromium"
    lock = ROOT / "_build" / ".browser-install.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # pytest-xdist workers: one installs, the others wait and reuse it
        path = _playwright_chromium()
        tried = lock.with_suffix(".tried")  # holds the id of the test run that tried: each run tries once
        run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
        if not path and (not tried.exists() or tried.read_text().strip() != run_id):
            tried.write_text(run_id + "\n")
            try:
                subprocess.run([sys.executable, "-m", "playwright", "install", "chromium"], timeout=300,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            except (OSError, subprocess.TimeoutExpired):
                pass
            path = _playwright_chromium()
    if path:
        return path, "Playwright's Chromium (just installed)"
    path = _system_browser()
    if path:
        return path, "a system browser"
    return None, HOW_TO_GET_ONE


@contextlib.contextmanager
def launch():
    """A launched headless Chromium (Playwright ``Browser``); skips the test, or fails it under
    ``REQUIRE_BROWSER=1``, when there is none."""
    path, how = find_browser()
    if path is None:
        if os.environ.get("REQUIRE_BROWSER") == "1":
            pytest.fail(f"REQUIRE_BROWSER=1 but {how}")
        pytest.skip(how)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()
