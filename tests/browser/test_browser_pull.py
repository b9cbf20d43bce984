"""The operations page's pull box in chromium, against a server whose hub is the double
(tests/hub_double.py): the progress bar moves and the model shows up, Cancel stops the download on
the server, and a failure is shown in words."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import Browsing, browsing
from tests.hub_double import HubDouble
from tests.server_proc import ServerProcess, serving

expect = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]' brings playwright").expect

MIB = 1 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("webui-pull")
    repos = {
        "acme/Tiny-GGUF": {"Tiny-Q4_0.gguf": b"GGUF" + os.urandom(3 * MIB)},
        "acme/Slow-GGUF": {"Slow-Q4_0.gguf": b"GGUF" + os.urandom(8 * MIB)},
    }
    with HubDouble(repos) as hub:
        hub.throttle("acme/Tiny-GGUF", "Tiny-Q4_0.gguf", chunk=128 << 10, delay=0.03)
        hub.throttle("acme/Slow-GGUF", "Slow-Q4_0.gguf", chunk=32 << 10, delay=0.03)
        env = {
            "HF_ENDPOINT": hub.url,
            "HF_HOME": str(base / "hf"),
            "HF_HUB_DISABLE_TELEMETRY": "1",
        }
        with serving(base / "data", env=env) as srv:
            yield srv


@pytest.fixture(scope="module")
def web(chromium: Any, server: ServerProcess, screenshots: Path) -> Iterator[Browsing]:
    with browsing(chromium, server.base_url, screenshots, viewport={"width": 1280, "height": 900}) as b:
        yield b


def listed(server: ServerProcess) -> set[str]:
    return {m["id"] for m in httpx.get(server.base_url + "/v1/models", timeout=10).json()["data"]}


def test_a_pull_shows_its_progress_and_then_the_model(web: Browsing, server: ServerProcess) -> None:
    page = web.page()
    page.goto(web.base_url + "/ops")
    page.fill("#pull-name", "hf.co/acme/Tiny-GGUF:Q4_0")
    page.click("#pull-start")
    expect(page.locator("#pull-cancel")).to_be_visible()
    # Part of the way: the bar has moved and is not full.
    expect(page.locator("#pull-status")).to_contain_text(
        re.compile(r"^Tiny-Q4_0\.gguf: .* \([1-9]\d?%\)$"), timeout=15_000
    )
    assert 0 < page.eval_on_selector("#pull-progress", "bar => bar.value") < 3 * MIB + 4
    web.shot(page, "ops-pull-progress")
    expect(page.locator("#pull-status")).to_have_text("pulled acme/Tiny-GGUF:Q4_0", timeout=30_000)
    expect(page.locator('#models tr[data-model="acme/Tiny-GGUF:Q4_0"]')).to_be_visible()
    expect(page.locator("#pull-cancel")).to_be_hidden()
    page.close()


def test_cancel_stops_the_download_on_the_server(web: Browsing, server: ServerProcess) -> None:
    page = web.page()
    page.goto(web.base_url + "/ops")
    page.fill("#pull-name", "acme/Slow-GGUF")
    page.click("#pull-start")
    expect(page.locator("#pull-status")).to_contain_text("%", timeout=15_000)
    page.click("#pull-cancel")
    expect(page.locator("#pull-status")).to_have_text("cancelled the pull of acme/Slow-GGUF")
    deadline = time.monotonic() + 15
    while "pull cancelled; nothing of it was kept" not in server.log():
        assert time.monotonic() < deadline, "the server kept downloading"
        time.sleep(0.05)
    assert "acme/Slow-GGUF:Q4_0" not in listed(server)
    page.close()


def test_a_failed_pull_says_why(web: Browsing) -> None:
    page = web.page()
    page.goto(web.base_url + "/ops")
    page.fill("#pull-name", "acme/does-not-exist")
    page.click("#pull-start")
    status = page.locator("#pull-status.error")
    expect(status).to_contain_text("no model repository acme/does-not-exist", timeout=15_000)
    page.fill("#pull-name", "llama3.2")
    page.click("#pull-start")
    expect(status).to_contain_text("400: 'llama3.2' is an Ollama library name")
    web.shot(page, "ops-pull-error")
    page.close()
    # The browser logs the 400 as a console error; that one was the point.
    assert [p for p in web.problems if "400" not in p] == []
    assert web.foreign == []
