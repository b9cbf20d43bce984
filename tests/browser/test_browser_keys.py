"""The web UI on a server that requires an API key: the pages load, the API answers 401 until the
key is entered in the page, and the page says so in words."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Browsing, browsing
from tests.conftest import MODEL
from tests.server_proc import ServerProcess, serving

expect = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]' brings playwright").expect

KEY = "webui-test-key-0123456789"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory.mktemp("webui-keys"), "--api-key", KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def web(chromium: Any, server: ServerProcess, screenshots: Path) -> Iterator[Browsing]:
    with browsing(chromium, server.base_url, screenshots) as b:
        yield b


def test_without_the_key_the_page_says_what_to_do_and_with_it_works(web: Browsing) -> None:
    page = web.page()
    page.goto(web.base_url + "/")
    banner = page.locator("#banner")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("requires an API key")
    web.shot(page, "chat-401")
    page.fill("#api-key", "wrong")
    page.dispatch_event("#api-key", "change")
    expect(banner).to_contain_text("the one entered was refused")
    page.fill("#api-key", KEY)
    page.dispatch_event("#api-key", "change")
    page.wait_for_selector(f'#model option[value="{MODEL}"]', state="attached")
    expect(banner).to_be_hidden()
    # The operations page uses the same stored key.
    page.goto(web.base_url + "/ops")
    page.wait_for_selector("#models tbody tr")
    expect(page.locator("#banner")).to_be_hidden()
    page.close()
    # The browser logs each 401 response as a console error; those were the point here.
    assert [p for p in web.problems if "401" not in p] == []
    assert web.foreign == []
