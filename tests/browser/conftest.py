"""The web UI in a real browser: Debian's chromium driven by Playwright (never `playwright install`).

Every page a test opens goes through `browser_page`: requests to any host but the server are
aborted and recorded (`foreign`), console errors, page errors and CSP violations are recorded
(`problems`), and screenshots go to one folder that the session prints at its end.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

try:
    from playwright import sync_api as playwright_sync
except ImportError:  # the test extra brings it; without it the browser tests skip
    playwright_sync = None  # type: ignore[assignment]


@dataclass
class Browsing:
    """One browser context on one server, and what it saw."""

    base_url: str
    context: Any
    shots: Path
    foreign: list[str] = field(default_factory=list)  # requests to other hosts (aborted)
    problems: list[str] = field(default_factory=list)  # console errors, page errors, CSP reports
    sizes: dict[str, int] = field(default_factory=dict)  # url -> bytes of headers + body received

    def page(self) -> Any:
        page = self.context.new_page()
        page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        return page

    def shot(self, page: Any, name: str) -> Path:
        path = self.shots / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("webui-screenshots")
    yield path
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and any(path.iterdir()):
        reporter.write_line(f"web UI screenshots: {path}")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if playwright_sync is None:
        pytest.skip("the browser tests need playwright: pip install -e '.[test]'")
    if not Path(CHROMIUM).exists():
        pytest.skip("the browser tests need Debian's chromium: `make browser` (as root) or apt-get install chromium")
    with playwright_sync.sync_playwright() as p:
        # --no-sandbox: the suite may run as root, where chromium's sandbox refuses to start.
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def browsing(browser: Any, base_url: str, shots: Path, **context_args: Any) -> Iterator[Browsing]:
    """browse()'s context for a block (a module's `web` fixture), closed after it."""
    b = browse(browser, base_url, shots, **context_args)
    try:
        yield b
    finally:
        b.context.close()


def browse(browser: Any, base_url: str, shots: Path, **context_args: Any) -> Browsing:
    """A context that lets the browser reach `base_url`'s origin and nothing else."""
    context = browser.new_context(**context_args)
    b = Browsing(base_url, context, shots)
    own = urlsplit(base_url).netloc

    def on_request(request: Any) -> None:
        split = urlsplit(request.url)
        if split.scheme in ("http", "https", "ws", "wss") and split.netloc != own:
            b.foreign.append(request.url)

    def guard(route: Any) -> None:
        split = urlsplit(route.request.url)
        if split.scheme in ("http", "https") and split.netloc != own:
            b.foreign.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    def on_finished(request: Any) -> None:
        try:
            sizes = request.sizes()
            b.sizes[request.url] = sizes["responseHeadersSize"] + sizes["responseBodySize"]
        except Exception:  # noqa: BLE001 - a request the page cancelled has no sizes
            pass

    context.on("request", on_request)
    context.on("requestfinished", on_finished)
    # Only other hosts are intercepted: the server's own responses (the chat stream) are not touched.
    context.route(lambda url: urlsplit(url).netloc != own, guard)
    return b
