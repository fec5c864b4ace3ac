"""Open local HTML pages in real headless Chromium (Debian's /usr/bin/chromium) for tests.

    with chromium() as browser:
        with open_page(path, browser=browser, block_network=True) as page:
            assert not page.problems
            page.count(".chart")
            page.screenshot(Path("test-artifacts/report.png"))

Playwright drives the system browser (no ``playwright install``; it cannot download browsers
here) and gives every page a fresh, throwaway profile. ``PageReport`` collects what went wrong
while the page loaded: console errors, uncaught exceptions, failed requests and any request that
left the machine.

Playwright is imported when a browser starts, not with this module: a test module that opens
pages collects (and its other tests run) where playwright is not installed; the tests that open
pages are marked ``needs("chromium")`` (tests/needs.py), whose probe asks for both.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Request, Route

CHROMIUM = os.environ.get("IOMATRIX_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]

# Every `.chart` holds a drawn Plotly figure, and a page that reports its own drawing state
# (<html data-charts="drawing|ready|error">) has finished.
CHARTS_DRAWN = """() => {
    const state = document.documentElement.dataset.charts;
    if (state !== undefined && state !== "ready" && state !== "error") return false;
    return [...document.querySelectorAll(".chart")].every((c) => c.querySelector(".main-svg"));
}"""


def chromium_available() -> bool:
    return Path(CHROMIUM).is_file() or shutil.which(CHROMIUM) is not None


@dataclass
class PageReport:
    """A loaded page and what went wrong while it loaded."""

    page: Page
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    """Requests for anything but file:, data: and blob: URLs (blocked or not)."""

    @property
    def problems(self) -> list[str]:
        """Everything that should not happen on a healthy self-contained page."""
        return (
            [f"console error: {m}" for m in self.console_errors]
            + [f"page error: {m}" for m in self.page_errors]
            + [f"failed request: {m}" for m in self.failed_requests]
            + [f"external request: {m}" for m in self.external_requests]
        )

    def count(self, selector: str) -> int:
        return self.page.locator(selector).count()

    def evaluate(self, expression: str, arg: object = None) -> object:
        return self.page.evaluate(expression, arg)

    def screenshot(self, path: Path, *, full_page: bool = True) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path), full_page=full_page)
        return path


@contextmanager
def chromium(*, headless: bool = True) -> Iterator[Browser]:
    """A headless Chromium for one or more pages; closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=headless
        )
        try:
            yield browser
        finally:
            browser.close()


def _is_local(url: str) -> bool:
    return url.startswith(("file:", "data:", "blob:", "about:"))


@contextmanager
def open_page(
    path: Path,
    *,
    browser: Browser | None = None,
    block_network: bool = False,
    wait_for: str | None = CHARTS_DRAWN,
    timeout_s: float = 15.0,
    viewport: tuple[int, int] = (1400, 900),
) -> Iterator[PageReport]:
    """Load ``path`` as a file:// page and wait until ``wait_for`` (a JS predicate) is true.

    With ``block_network`` every request that is not file:/data:/blob: is aborted. Either way such
    requests are listed in ``external_requests``. Pass ``wait_for=None`` to wait only for "load".
    Launches its own browser unless one is given.
    """
    if browser is None:
        with chromium() as own:
            with open_page(
                path,
                browser=own,
                block_network=block_network,
                wait_for=wait_for,
                timeout_s=timeout_s,
                viewport=viewport,
            ) as report:
                yield report
        return

    context = browser.new_context(
        viewport={"width": viewport[0], "height": viewport[1]}, service_workers="block"
    )
    try:
        page = context.new_page()
        report = PageReport(page)

        def on_request(request: Request) -> None:
            if not _is_local(request.url):
                report.external_requests.append(request.url)

        def on_console(message) -> None:  # playwright ConsoleMessage
            if message.type == "error":
                report.console_errors.append(message.text)

        page.on("console", on_console)
        page.on("pageerror", lambda exc: report.page_errors.append(str(exc)))
        page.on("request", on_request)
        page.on(
            "requestfailed",
            lambda r: report.failed_requests.append(f"{r.url} ({r.failure})"),
        )
        if block_network:

            def route(route: Route) -> None:
                if _is_local(route.request.url):
                    route.continue_()
                else:
                    route.abort("internetdisconnected")

            context.route("**/*", route)

        timeout_ms = timeout_s * 1000
        page.goto(Path(path).resolve().as_uri(), wait_until="load", timeout=timeout_ms)
        if wait_for is not None:
            page.wait_for_function(wait_for, timeout=timeout_ms)
        yield report
    finally:
        context.close()
