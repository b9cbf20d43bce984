"""The voice page (/voice) in chromium, with a fake microphone that says a question, against one
real server: its bundled chat model (SmolLM2-135M), Whisper, Silero VAD and the Piper voice.

The microphone is chromium's fake capture device playing a WAV file: the server's own Piper voice
saying QUESTION, with a second of silence before it and two after, played once (`%noloop`: looped,
the file would ask again every five seconds, and each asking would interrupt the answer to the
last). Chromium plays the file from its start each time a page opens the microphone.

What is proven is what a person would see and hear: the words they said in the transcript, an
answer under them, its audio played (the status line went through "speaking" and back), push to
talk sending one turn when the button is let go, an answer spoken over stopping at once, the
microphone asked for only on Start and released on Stop; and the page asks no other host for
anything, with no console error or CSP violation.
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import re
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import CHROMIUM, Browsing, browsing, playwright_sync
from tests.conftest import MODEL
from tests.server_proc import ServerProcess, serving

expect = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]' brings playwright").expect

VOICE = "rhasspy/piper-en_US-joe:medium"
QUESTION = "What is the capital of France?"
INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."
LONG = 120_000  # ms: the first turn loads four models (VAD, Whisper, the chat model, Piper) on a busy 2-core box
BEFORE_S, AFTER_S = 1.0, 2.0  # silence around the question

# Recorded in the page before its own scripts run: each microphone stream it opens (to check when
# it asks, and that Stop releases it), each status it shows, and each audio buffer stopped early.
WATCH = """
window.__streams = [];
window.__states = [];
window.__stops = 0;
const stop = AudioScheduledSourceNode.prototype.stop;
AudioScheduledSourceNode.prototype.stop = function (...when) { window.__stops++; return stop.apply(this, when); };
const getUserMedia = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
navigator.mediaDevices.getUserMedia = async (c) => { const m = await getUserMedia(c); window.__streams.push(m); return m; };
document.addEventListener('DOMContentLoaded', () => new MutationObserver(() => {
    const s = document.getElementById('status').dataset.state;
    if (window.__states[window.__states.length - 1] !== s) window.__states.push(s);
}).observe(document.getElementById('status'), {attributes: true, attributeFilter: ['data-state']}));
"""

# The barge-in test's microphone: the fake device mixed with what `window.__say(wav_base64)` plays,
# so that the test speaks exactly when it wants to (while an answer plays), whatever the answer's
# length. Added before WATCH, so that WATCH records the stream the page itself gets.
MIXER = """
const openDevice = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
navigator.mediaDevices.getUserMedia = async (c) => {
    const device = await openDevice(c);
    const ctx = new AudioContext();
    await ctx.resume();
    const mixed = ctx.createMediaStreamDestination();
    ctx.createMediaStreamSource(device).connect(mixed);
    window.__say = async (b64) => {
        const wav = Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
        const speech = new AudioBufferSourceNode(ctx, {buffer: await ctx.decodeAudioData(wav.buffer)});
        speech.connect(mixed);
        speech.start();
    };
    return mixed.stream;
};
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory.mktemp("webui-voice"), "--nctx", "2048") as srv:
        models = httpx.get(srv.base_url + "/v1/models", timeout=10).json()["data"]
        able = {c for m in models for c in m["capabilities"]}
        missing = {"chat", "transcription", "vad", "speech"} - able
        if missing:
            pytest.skip(f"the voice page needs models this install lacks: {sorted(missing)} (make install-test)")
        yield srv


@pytest.fixture(scope="module")
def spoken(server: ServerProcess) -> bytes:
    """QUESTION as the server's Piper voice says it: a WAV file."""
    r = httpx.post(server.base_url + "/v1/audio/speech", json={"model": VOICE, "input": QUESTION}, timeout=300)
    r.raise_for_status()
    return r.content


def padded(wav: bytes, path: Path) -> Path:
    """`wav` between BEFORE_S and AFTER_S of silence, written to `path`."""
    with wave.open(io.BytesIO(wav)) as w:
        rate, speech = w.getframerate(), w.readframes(w.getnframes())
        assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(2 * int(BEFORE_S * rate)) + speech + bytes(2 * int(AFTER_S * rate)))
    return path


@pytest.fixture(scope="module")
def hearing_chromium(spoken: bytes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Chromium whose microphone says the question once per stream opened, allowed without asking
    (--no-sandbox: the suite may run as root)."""
    if playwright_sync is None:
        pytest.skip("the browser tests need playwright: pip install -e '.[test]'")
    if not Path(CHROMIUM).exists():
        pytest.skip("the browser tests need Debian's chromium: `make browser` (as root) or apt-get install chromium")
    wav = padded(spoken, tmp_path_factory.mktemp("voice-mic") / "question.wav")
    args = ["--no-sandbox", "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={wav}%noloop"]  # fmt: skip
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def web(hearing_chromium: Any, server: ServerProcess, screenshots: Path) -> Iterator[Browsing]:
    with browsing(hearing_chromium, server.base_url, screenshots, viewport={"width": 1100, "height": 800}) as b:
        yield b


def voice_page(web: Browsing, mode: str, *scripts: str) -> Any:
    """/voice, set up to make the small model answer briefly; every WebSocket frame recorded
    (`page.sent`, `page.received`: the events as dicts); `scripts` run before the page's own."""
    page = web.page()
    page.sent, page.received = [], []

    def on_socket(ws: Any) -> None:
        ws.on("framesent", lambda f: page.sent.append(json.loads(f)))
        ws.on("framereceived", lambda f: page.received.append(json.loads(f)))

    page.on("websocket", on_socket)
    for script in (*scripts, WATCH):
        page.add_init_script(script)
    page.goto(web.base_url + "/voice")
    page.wait_for_selector(f'#model option[value="{MODEL}"]', state="attached")
    page.select_option("#model", MODEL)
    page.fill("#instructions", INSTRUCTIONS)
    page.fill("#max-tokens", "40")
    page.check(f'input[name="mode"][value="{mode}"]')
    assert page.evaluate("window.__streams.length") == 0, "the microphone was asked for before Start"
    return page


def heard(page: Any) -> str:
    """The user's first turn, once Whisper's transcript is complete."""
    user = page.locator("#transcript .msg.user").first
    expect(user).to_have_attribute("data-state", "done", timeout=LONG)
    return user.locator(".body").inner_text()


def answered(page: Any) -> Any:
    answer = page.locator("#transcript .msg.assistant").first
    expect(answer).to_have_attribute("data-state", re.compile("^(completed|incomplete)$"), timeout=LONG)
    assert answer.locator(".body").inner_text().strip()
    return answer


def stop_releases_the_microphone(page: Any) -> None:
    page.click("#stop")
    expect(page.locator("#status")).to_have_attribute("data-state", "stopped")
    assert page.evaluate("window.__streams.length") == 1
    assert page.evaluate("window.__streams.every((m) => m.getTracks().every((t) => t.readyState === 'ended'))")
    expect(page.locator("#start")).to_be_visible()


def test_hands_free_a_spoken_question_is_heard_and_answered_aloud(web: Browsing) -> None:
    page = voice_page(web, "vad")
    page.click("#start")
    words = heard(page)
    print(f"heard: {words!r}")
    assert "capital" in words.lower() and "france" in words.lower(), words
    answer = answered(page)
    print(f"answer: {answer.locator('.body').inner_text()!r} ({answer.get_attribute('data-audio-ms')} ms of audio)")
    assert int(answer.get_attribute("data-audio-ms") or 0) > 0
    # Its audio played through to the end (each buffer's `ended` came), then the page listened again.
    expect(page.locator("#status")).to_have_attribute("data-state", "listening", timeout=LONG)
    states = page.evaluate("window.__states")
    assert states[:2] == ["connecting", "listening"] and "hearing" in states and "speaking" in states, states
    assert states.index("hearing") < states.index("speaking"), states
    # The session asked for what the page shows: the user's words, server VAD, a short answer.
    update = next(ev for ev in page.sent if ev["type"] == "session.update")["session"]
    assert update["audio"]["input"] == {
        "transcription": {"model": "whisper-1"},
        "turn_detection": {"type": "server_vad"},
    }
    assert update["instructions"] == INSTRUCTIONS and update["max_output_tokens"] == 40 and update["model"] == MODEL
    appends = [ev for ev in page.sent if ev["type"] == "input_audio_buffer.append"]
    assert len(appends) > 20 and not any(ev["type"] == "input_audio_buffer.commit" for ev in page.sent)
    received = [ev["type"] for ev in page.received]
    assert "error" not in received, [ev for ev in page.received if ev["type"] == "error"]
    assert received.count("input_audio_buffer.speech_started") == 1, "the file was heard twice (looped?)"
    expect(page.locator("#voice-error")).to_be_hidden()
    web.shot(page, "voice-hands-free")
    stop_releases_the_microphone(page)
    page.close()


def test_push_to_talk_holding_the_button_sends_one_turn(web: Browsing) -> None:
    page = voice_page(web, "ptt")
    page.click("#start")
    status = page.locator("#status")
    expect(status).to_have_attribute("data-state", "listening", timeout=LONG)
    talk = page.locator("#talk")
    expect(talk).to_be_visible()
    box = talk.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    expect(status).to_have_attribute("data-state", "recording")
    expect(talk).to_have_attribute("aria-pressed", "true")
    # The file started when Start opened the microphone: hold until its speech is over.
    page.wait_for_timeout(int((BEFORE_S + 2.5) * 1000))
    assert page.locator("#transcript .msg").count() == 0  # nothing is sent as a turn while held
    page.mouse.up()
    expect(talk).to_have_attribute("aria-pressed", "false")
    words = heard(page)
    print(f"heard: {words!r}")
    assert "capital" in words.lower() and "france" in words.lower(), words
    answered(page)
    update = next(ev for ev in page.sent if ev["type"] == "session.update")["session"]
    assert update["audio"]["input"]["turn_detection"] is None
    kinds = [ev["type"] for ev in page.sent]
    assert kinds.count("input_audio_buffer.commit") == 1 and kinds.count("response.create") == 1, kinds
    assert kinds.index("input_audio_buffer.commit") < kinds.index("response.create")
    received = [ev["type"] for ev in page.received]
    assert "input_audio_buffer.speech_started" not in received  # no server VAD: the button took the turn
    assert "error" not in received, [ev for ev in page.received if ev["type"] == "error"]
    expect(status).to_have_attribute("data-state", "listening", timeout=LONG)
    web.shot(page, "voice-push-to-talk")
    stop_releases_the_microphone(page)
    page.close()


def test_speaking_over_the_answer_stops_its_audio_at_once(web: Browsing, spoken: bytes) -> None:
    """Barge-in: once the answer to the question plays, the question is said again over it; the
    page stops its audio as the server says speech started, marks the answer interrupted, and
    tells the server how much of it was heard."""
    page = voice_page(web, "vad", MIXER)
    page.fill("#instructions", "You are a helpful assistant. Answer in three long sentences.")
    page.fill("#max-tokens", "120")
    page.click("#start")
    page.wait_for_function("() => window.__states.includes('speaking')", timeout=LONG)
    page.evaluate("(wav) => window.__say(wav)", base64.b64encode(spoken).decode())
    # "hearing" right after "speaking": the speech interrupted the answer while it played.
    page.wait_for_function("() => window.__states.some((s, i) => s === 'speaking' && window.__states[i + 1] === 'hearing')",
                           timeout=LONG)  # fmt: skip
    assert page.evaluate("window.__stops") > 0  # its queued buffers were stopped, not left to play out
    cut = page.locator('#transcript .msg.assistant[data-interrupted="true"]')
    expect(cut).to_have_count(1)
    expect(cut.locator(".stats")).to_contain_text("interrupted after")
    item = cut.get_attribute("data-item")
    sent = [ev for ev in page.sent if ev["type"] == "conversation.item.truncate"]
    assert len(sent) == 1 and sent[0]["item_id"] == item and sent[0]["content_index"] == 0, sent
    audio = [
        ev["delta"] for ev in page.received if ev["type"] == "response.output_audio.delta" and ev["item_id"] == item
    ]
    received_ms = sum(len(base64.b64decode(a)) for a in audio) / 48
    print(f"barge-in: {sent[0]['audio_end_ms']} ms heard of the answer's {received_ms:.0f} ms")
    assert 0 <= sent[0]["audio_end_ms"] < received_ms
    # The server cut the item to what was heard (the page's measure; if the answer was still being
    # made, the server's own estimate first, as it cancelled it).
    expect(page.locator("#transcript .msg.user")).to_have_count(2)
    expect(page.locator("#transcript .msg.user").nth(1)).to_have_attribute("data-state", "done", timeout=LONG)
    assert any(ev["type"] == "conversation.item.truncated" and ev["item_id"] == item for ev in page.received)
    assert [ev for ev in page.received if ev["type"] == "error"] == []
    expect(page.locator("#voice-error")).to_be_hidden()
    web.shot(page, "voice-barge-in")
    stop_releases_the_microphone(page)
    page.close()


def test_the_capture_worklet_makes_24_khz_pcm_at_any_context_rate(web: Browsing) -> None:
    """voice-worklet.js in an offline context at each rate, fed one second of a 440 Hz tone: 80 ms
    chunks of 24 kHz 16-bit PCM that hold that tone (its zero crossings) at full scale."""
    page = web.page()
    page.goto(web.base_url + "/voice")
    for rate in (48_000, 44_100, 24_000, 16_000):
        chunks = page.evaluate("""async (rate) => {
            const ctx = new OfflineAudioContext(1, rate, rate);
            await ctx.audioWorklet.addModule('/static/app/voice-worklet.js');
            const tap = new AudioWorkletNode(ctx, 'geniex-capture',
                {numberOfInputs: 1, numberOfOutputs: 0, channelCount: 1, channelCountMode: 'explicit'});
            const chunks = [];
            tap.port.onmessage = (e) => chunks.push(Array.from(new Int16Array(e.data.pcm)));
            const tone = new OscillatorNode(ctx, {frequency: 440});
            tone.connect(tap);
            tone.start();
            await ctx.startRendering();
            await new Promise((r) => setTimeout(r, 300));  // the port's last messages
            return chunks;
        }""", rate)  # fmt: skip
        assert [len(c) for c in chunks] == [1920] * 12, (rate, [len(c) for c in chunks])  # 12 x 80 ms of the second
        pcm = [v for c in chunks for v in c]
        crossings = sum((a < 0) != (b < 0) for a, b in itertools.pairwise(pcm))
        assert abs(crossings - 2 * 440 * 0.96) <= 8, (rate, crossings)
        assert 30_000 < max(pcm) <= 32_767 and -32_767 <= min(pcm) < -30_000, (rate, max(pcm), min(pcm))
    page.close()


def test_the_page_fits_a_phone(web: Browsing, hearing_chromium: Any, server: ServerProcess) -> None:
    with browsing(hearing_chromium, server.base_url, web.shots, viewport={"width": 390, "height": 844},
                  is_mobile=True, has_touch=True) as phone:  # fmt: skip
        page = phone.page()
        page.goto(server.base_url + "/voice")
        page.wait_for_selector(f'#model option[value="{MODEL}"]', state="attached")
        page.check('input[name="mode"][value="ptt"]')
        # Nothing wider than the screen (a long model name included): no sideways scrolling.
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        web.shot(page, "voice-phone")
        web.foreign += phone.foreign
        web.problems += phone.problems


def test_no_request_went_to_another_host(web: Browsing) -> None:
    assert web.foreign == []
    assert web.problems == []
