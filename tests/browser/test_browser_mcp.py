"""The chat page's MCP tools in chromium, against one server whose --mcp-config runs the
deterministic test server (tests/mcp_test_server.py) as `calc`: the Tools panel lists its tools,
a switched-on server sends the chat through /v1/responses, each call shows its arguments and the
tool's real result (or its error), an approval prompt runs the call only once approved, and the
page asks no other host for anything.

The model (SmolLM2-135M) is too small to choose a tool reliably, so the tests use the panel's
"force a call" (`tool_choice: {type: "mcp", server_label, name}` and `max_tool_calls: 1`): the
call is then certain, and its arguments follow the tool's input schema; what the model puts in
them is read from the page, never assumed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Browsing, browse, browsing
from tests.conftest import MODEL
from tests.server_proc import ServerProcess, serving

expect = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]' brings playwright").expect

MCP_SERVER = Path(__file__).resolve().parent.parent / "mcp_test_server.py"
LONG = 120_000  # ms: the first answer loads the model, on a busy 2-core box
QUESTION = "What is 2 plus 3? Use the add tool."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("webui-mcp")
    config = base / "mcp.json"
    calc = {"command": sys.executable, "args": [str(MCP_SERVER), "stdio"]}
    config.write_text(json.dumps({"mcpServers": {"calc": calc}}))
    with serving(base / "data", "--nctx", "2048", "--mcp-config", str(config)) as srv:
        yield srv


@pytest.fixture(scope="module")
def web(chromium: Any, server: ServerProcess, screenshots: Path) -> Iterator[Browsing]:
    with browsing(chromium, server.base_url, screenshots, viewport={"width": 1280, "height": 900}) as b:
        yield b


@pytest.fixture(scope="module")
def chat(web: Browsing) -> Any:
    """The chat page, kept open across the tests; each request body it posts is recorded."""
    page = web.page()
    page.posted = []  # (path, JSON body) of each POST
    page.on("request", lambda req: page.posted.append((req.url.removeprefix(web.base_url), req.post_data_json))
            if req.method == "POST" else None)  # fmt: skip
    page.goto(web.base_url + "/")
    page.wait_for_selector(f'#model option[value="{MODEL}"]', state="attached")
    page.select_option("#model", MODEL)
    page.click(".more summary")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "64")
    return page


def calc(page: Any) -> Any:
    page.evaluate("document.getElementById('mcp').open = true")
    return page.locator('#mcp-servers li[data-server="calc"]')


def use_calc(page: Any, *, on: bool = True, ask: bool = False, force: str = "add") -> None:
    """The Tools panel's settings of `calc` for the conversation shown."""
    server = calc(page)
    server.locator(".mcp-on").set_checked(on)
    if on:
        server.locator(".mcp-ask").set_checked(ask)
        server.locator(".mcp-force").select_option(force)


def send(page: Any, text: str) -> Any:
    before = page.locator(".msg.assistant").count()
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    answer = page.locator(".msg.assistant").nth(before)
    answer.wait_for()
    return answer


def added(arguments: Any) -> tuple[int, int]:
    """The add tool's arguments as the page shows them (pretty-printed JSON)."""
    args = json.loads(arguments.inner_text())
    assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values()), args
    return args["a"], args["b"]


def test_the_tools_panel_lists_the_servers_tools(web: Browsing, chat: Any) -> None:
    expect(chat.locator("#mcp")).to_be_visible()
    server = calc(chat)
    expect(server.locator('.mcp-tools li[data-tool="add"]')).to_contain_text("Add two integers.")
    expect(server.locator('.mcp-tools li[data-tool="lookup"] code')).to_have_text("lookup")
    assert server.locator(".mcp-list-error").count() == 0
    # Off by default: the page chats as before, and the switches that need the server on wait.
    expect(server.locator(".mcp-on")).not_to_be_checked()
    expect(server.locator(".mcp-ask")).to_be_disabled()
    web.shot(chat, "chat-mcp-panel")


def test_a_call_shows_its_arguments_and_the_tools_real_result(web: Browsing, chat: Any) -> None:
    use_calc(chat, ask=False, force="add")
    expect(chat.locator("#mcp-count")).to_have_text("· on: calc")
    chat.posted.clear()
    answer = send(chat, QUESTION)
    expect(answer).to_have_attribute("data-state", "done", timeout=LONG)
    path, body = chat.posted[-1]
    assert path == "/v1/responses"
    assert body["stream"] is True and body["store"] is True
    assert body["tools"] == [{"type": "mcp", "server_label": "calc", "require_approval": "never"}]
    assert body["tool_choice"] == {"type": "mcp", "server_label": "calc", "name": "add"}
    assert body["max_tool_calls"] == 1
    assert body["input"][-1] == {"role": "user", "content": QUESTION}

    call = answer.locator(".mcp-call")
    expect(call).to_have_count(1)
    expect(call).to_have_attribute("data-status", "completed")
    assert call.locator(".mcp-server-name").inner_text() == "calc"
    assert call.locator(".mcp-tool-name").inner_text() == "add"
    a, b = added(call.locator(".mcp-arguments"))
    assert call.locator(".mcp-output").inner_text() == str(a + b)
    # The model's answer after the call (it read the result), below the call.
    assert answer.locator(".steps > .mcp-call + .answer-body").inner_text().strip()
    assert "first token" in answer.locator(".stats").inner_text()
    web.shot(chat, "chat-mcp-call")


def test_a_failing_tool_shows_its_error(web: Browsing, chat: Any) -> None:
    use_calc(chat, ask=False, force="fail")
    answer = send(chat, "Run the fail tool.")
    expect(answer).to_have_attribute("data-state", "done", timeout=LONG)
    call = answer.locator(".mcp-call")
    expect(call).to_have_attribute("data-status", "failed")
    assert call.locator(".mcp-tool-name").inner_text() == "fail"
    expect(call.locator(".mcp-error")).to_contain_text("the tool failed on purpose")
    assert call.locator(".mcp-output").count() == 0


def test_with_the_server_off_the_conversation_goes_on_without_tools(web: Browsing, chat: Any) -> None:
    # The calls above go back to /v1/responses as the items they came as; no tool is offered now.
    use_calc(chat, on=False)
    expect(chat.locator("#mcp-count")).to_have_text("")
    chat.posted.clear()
    answer = send(chat, "Thanks. And what is 2 plus 3 plus 1?")
    expect(answer).to_have_attribute("data-state", "done", timeout=LONG)
    path, body = chat.posted[-1]
    assert path == "/v1/responses" and body["tools"] == [] and "tool_choice" not in body
    kinds = [item.get("type", item.get("role")) for item in body["input"]]
    assert kinds.count("mcp_call") == 2 and kinds[-1] == "user", kinds
    calls = [item for item in body["input"] if item.get("type") == "mcp_call"]
    assert calls[0]["name"] == "add" and calls[1]["error"]["type"] == "mcp_tool_execution_error"
    assert answer.locator(".answer-body").inner_text().strip()


def test_an_approved_call_runs_after_approve(web: Browsing, chat: Any) -> None:
    chat.click("#new-chat")
    use_calc(chat, ask=True, force="add")
    answer = send(chat, QUESTION)
    expect(answer).to_have_attribute("data-state", "awaiting", timeout=LONG)
    request = answer.locator(".mcp-approval")
    expect(request).to_have_count(1)
    assert request.locator(".mcp-server-name").inner_text() == "calc"
    assert request.locator(".mcp-tool-name").inner_text() == "add"
    a, b = added(request.locator(".mcp-arguments"))
    assert answer.locator(".mcp-call").count() == 0  # nothing ran yet
    assert "waiting for your approval" in answer.locator(".stats").inner_text()
    web.shot(chat, "chat-mcp-approval")

    chat.posted.clear()
    request.locator("button.approve").click()
    expect(answer).to_have_attribute("data-state", "done", timeout=LONG)
    path, body = chat.posted[-1]
    assert path == "/v1/responses" and body["tools"][0]["require_approval"] == "always"
    approval_id = body["input"][-1]["approval_request_id"]
    assert body["input"][-1] == {"type": "mcp_approval_response", "approval_request_id": approval_id, "approve": True}
    expect(request.locator(".mcp-decision")).to_have_text("approved")
    call = answer.locator(".mcp-call")
    expect(call).to_have_count(1)
    expect(call).to_have_attribute("data-status", "completed")
    assert added(call.locator(".mcp-arguments")) == (a, b)
    assert call.locator(".mcp-output").inner_text() == str(a + b)
    web.shot(chat, "chat-mcp-approved")


def test_a_denied_call_does_not_run(web: Browsing, chat: Any) -> None:
    answer = send(chat, QUESTION)
    expect(answer).to_have_attribute("data-state", "awaiting", timeout=LONG)
    answer.locator(".mcp-approval button.deny").click()
    expect(answer.locator(".mcp-approval").first.locator(".mcp-decision")).to_have_text("denied: not run")
    # The model reads that the call was not approved; it may ask again (another prompt), never run it.
    chat.wait_for_function(
        "() => ['done', 'awaiting'].includes([...document.querySelectorAll('.msg.assistant')].pop().dataset.state)"
        " && !document.getElementById('stop').checkVisibility()", timeout=LONG)  # fmt: skip
    assert answer.locator(".mcp-call").count() == 0


def test_the_tools_panel_fits_a_phone(web: Browsing, chromium: Any, server: ServerProcess) -> None:
    phone = browse(chromium, server.base_url, web.shots, viewport={"width": 390, "height": 844}, is_mobile=True,
                   has_touch=True)  # fmt: skip
    try:
        page = phone.page()
        page.goto(server.base_url + "/")
        use_calc(page, ask=True, force="add")
        expect(calc(page).locator('.mcp-tools li[data-tool="add"]')).to_be_visible()
        # Nothing wider than the screen: no sideways scrolling.
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        web.shot(page, "chat-mcp-phone")
        web.foreign += phone.foreign
        web.problems += phone.problems
    finally:
        phone.context.close()


def test_no_request_went_to_another_host(web: Browsing) -> None:
    assert web.foreign == []
    assert web.problems == []
