"""Headless Chromium for the report checks: Debian's ``chromium`` package, driven by Playwright
(``playwright`` from PyPI drives a browser given by path; nothing is downloaded at run time).

:func:`find_chromium` returns the browser, installing Debian's package with apt-get when it is
missing and this process may (root, apt-get present); only when that fails does it give the reason
the caller skips with.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

NAMES = ("chromium", "chromium-browser")
# The flags of the environment's browser probe: no sandbox (root in a container), no GPU, no
# network beyond the page (no QUIC, first-run, background, component-update or sync traffic).
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def _which() -> str | None:
    return next((path for name in NAMES if (path := shutil.which(name))), None)


def find_chromium(install_timeout_s: float = 900.0) -> tuple[str | None, str]:
    """``(path, "")``, or ``(None, why no Chromium could be had)``."""
    path = _which()
    if path:
        return path, ""
    if shutil.which("apt-get") is None:
        return None, "no chromium on PATH and no apt-get to install Debian's chromium package"
    if os.geteuid() != 0:
        return None, "no chromium on PATH and not root: cannot apt-get install chromium"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
            done = subprocess.run(command, capture_output=True, text=True, timeout=install_timeout_s, env=env)
            if done.returncode != 0:
                return None, f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}"
    except subprocess.TimeoutExpired:
        return None, f"apt-get install chromium took over {install_timeout_s:g} s"
    path = _which()
    return (path, "") if path else (None, "apt-get installed chromium but no chromium is on PATH")


@dataclass
class PageCheck:
    """What the browser saw: console errors and page errors, the plots (name, loaded, width in
    pixels), the tables' ids and row counts, and the screenshot's path."""

    errors: list[str] = field(default_factory=list)
    plots: list[tuple[str, bool, int]] = field(default_factory=list)
    tables: dict[str, int] = field(default_factory=dict)
    screenshot: Path | None = None


def check_page(chromium: str, page_path: Path, screenshot: Path) -> PageCheck:
    """Open ``page_path`` in headless Chromium (a new empty profile), wait for the load event,
    collect errors, inspect every ``img[data-plot]`` and take a full-page screenshot."""
    from playwright.sync_api import sync_playwright

    check = PageCheck()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: check.errors.append(f"console.{m.type}: {m.text}")
                    if m.type in ("error", "assert") else None)
            page.on("pageerror", lambda e: check.errors.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: check.errors.append(f"request failed: {r.url}"))
            page.goto(page_path.resolve().as_uri(), wait_until="load")
            check.plots = [tuple(x) for x in page.evaluate(
                "Array.from(document.querySelectorAll('img[data-plot]'))"
                ".map(i => [i.dataset.plot, i.complete, i.naturalWidth])")]
            check.tables = page.evaluate(
                "Object.fromEntries(Array.from(document.querySelectorAll('h2')).map(h => "
                "[h.id, (h.nextElementSibling && h.nextElementSibling.tagName === 'TABLE') ? "
                "h.nextElementSibling.rows.length : -1]))")
            page.screenshot(path=str(screenshot), full_page=True)
            check.screenshot = screenshot
        finally:
            browser.close()
    return check
