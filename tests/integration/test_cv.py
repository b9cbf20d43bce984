"""POST /v1/cv against the real server, worker and the PP-OCR models the `rapidocr` wheel carries.

The images are synthetic: the test renders known words with Pillow's own TrueType font
(`ImageFont.load_default(size=...)`, Pillow >= 10.1) and compares what the server reads with the
words, and the boxes it returns with the box Pillow says each line of text covers.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
from PIL import Image, ImageDraw, ImageFont

from gateway.models.store import OCR_MODEL_ID
from tests.server_proc import ServerProcess

pytestmark = pytest.mark.skipif(importlib.util.find_spec("rapidocr") is None,
                                reason="the OCR model comes with the vision extra (rapidocr)")  # fmt: skip

CHAT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1"
# The first request loads the worker; an image takes seconds on a busy 2-core box. Beyond the
# server's own bound on a first request (60 s waiting for room to load, then --load-timeout-s, 120),
# so that a stuck load fails with the server's 503 and its reason, not a client timeout (CI saw
# one 180 s timeout, 2026-12-02, whose cause its lost log could not tell).
TIMEOUT = 200


@dataclass
class Rendered:
    png: bytes
    lines: list[tuple[str, tuple[int, int, int, int]]]  # each line's text and the box Pillow drew it in

    def jpeg(self) -> bytes:
        out = io.BytesIO()
        Image.open(io.BytesIO(self.png)).convert("RGB").save(out, "JPEG", quality=95)
        return out.getvalue()


def render(lines: list[str], size: tuple[int, int] = (360, 240)) -> Rendered:
    """Black words on white, one line each, 40 px TrueType; near-square, as the detector is cheapest so."""
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=40)
    drawn = []
    for i, text in enumerate(lines):
        at = (24, 40 + 90 * i)
        draw.text(at, text, fill="black", font=font)
        drawn.append((text, draw.textbbox(at, text, font=font)))
    out = io.BytesIO()
    img.save(out, "PNG")
    return Rendered(out.getvalue(), drawn)


HELLO = render(["Hello GenieX", "Invoice 4711"])


def cv(server: ServerProcess, image: str, model: str = OCR_MODEL_ID, **extra: object) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/cv", json={"model": model, "image": image, **extra}, timeout=TIMEOUT)


def words(text: str) -> str:
    return " ".join(text.split())


def check_read(body: dict, rendered: Rendered) -> None:  # type: ignore[type-arg]
    """The lines come back as drawn, in reading order, each box holding its line's drawn box."""
    results = body["results"]
    assert [words(r["label"]) for r in results] == [text for text, _ in rendered.lines], body
    for r, (text, (x0, y0, x1, y1)) in zip(results, rendered.lines):
        assert 0.5 < r["confidence"] <= 1.0, r
        b = r["bbox"]
        slack = 2  # the detector's outline may sit a pixel inside a glyph's anti-aliased edge
        assert b["x"] <= x0 + slack and b["y"] <= y0 + slack, (text, b, (x0, y0, x1, y1))
        assert b["x"] + b["width"] >= x1 - slack and b["y"] + b["height"] >= y1 - slack, (text, b, (x0, y0, x1, y1))
        # ...and not much more than it: the box is this line's, not the page's.
        assert b["width"] * b["height"] < 2.5 * (x1 - x0) * (y1 - y0), (text, b, (x0, y0, x1, y1))


def test_reads_rendered_words_with_boxes_around_them(server: ServerProcess) -> None:
    r = cv(server, base64.b64encode(HELLO.png).decode())
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"results"}
    check_read(r.json(), HELLO)
    for res in r.json()["results"]:
        assert set(res) == {"label", "confidence", "bbox"} and set(res["bbox"]) == {"x", "y", "width", "height"}


def test_data_url_of_a_jpeg(server: ServerProcess) -> None:
    url = "data:image/jpeg;base64," + base64.b64encode(HELLO.jpeg()).decode()
    r = cv(server, url, user="cv-usage")
    assert r.status_code == 200, r.text
    check_read(r.json(), HELLO)
    # Usage: the request is the image; the characters read are its completion tokens.
    rows = httpx.get(f"{server.base_url}/v1/usage", params={"model": OCR_MODEL_ID}, timeout=10).json()["data"]
    mine = [row for row in rows if row["user"] == "cv-usage"]
    chars = sum(len(res["label"]) for res in r.json()["results"])
    assert len(mine) == 1 and (mine[0]["requests"], mine[0]["prompt_tokens"], mine[0]["completion_tokens"]) == (
        1,
        0,
        chars,
    )


def test_an_image_without_text_has_no_results(server: ServerProcess) -> None:
    blank = io.BytesIO()
    Image.new("L", (200, 200), 255).save(blank, "PNG")
    r = cv(server, base64.b64encode(blank.getvalue()).decode())
    assert r.status_code == 200, r.text
    assert r.json() == {"results": []}


def test_two_clients_at_once_are_both_served(server: ServerProcess) -> None:
    other = render(["Quick brown fox"], size=(400, 200))
    images = [HELLO, other]
    with ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda im: cv(server, base64.b64encode(im.png).decode()), images))
    for reply, rendered in zip(replies, images):
        assert reply.status_code == 200, reply.text
        check_read(reply.json(), rendered)


def test_a_url_is_refused_unless_the_operator_allows_its_host(server: ServerProcess) -> None:
    r = cv(server, "http://127.0.0.1:9/secret.png")
    assert r.status_code == 400
    assert "--fetch-host" in r.json()["error"] and "`image`" in r.json()["error"]


def test_unknown_model_is_404(server: ServerProcess) -> None:
    r = cv(server, base64.b64encode(HELLO.png).decode(), model="nobody/ocr:fp32")
    assert r.status_code == 404 and "nobody/ocr" in r.json()["error"]


def test_a_chat_model_is_the_wrong_kind(server: ServerProcess) -> None:
    r = cv(server, base64.b64encode(HELLO.png).decode(), model=CHAT_MODEL)
    assert r.status_code == 400
    error = r.json()["error"]
    assert CHAT_MODEL in error and "ocr" in error and OCR_MODEL_ID in error  # names one that does


@pytest.mark.parametrize(
    ("image", "says"),
    [
        ("", "`image` is empty"),
        ("not base64 at all!", "`image` is neither valid base64"),
        (base64.b64encode(b"these bytes are no picture").decode(), "`image` could not be read as an image"),
        (
            "data:image/png;base64," + base64.b64encode(HELLO.png[: len(HELLO.png) // 2]).decode(),
            "could not be decoded",
        ),
    ],
    ids=["empty", "bad-base64", "not-an-image", "truncated-png"],
)
def test_bad_images_are_400(server: ServerProcess, image: str, says: str) -> None:
    r = cv(server, image)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]


def test_bounds_on_the_image_are_400_and_the_worker_lives_on(server: ServerProcess) -> None:
    bomb = io.BytesIO()
    Image.new("1", (8000, 6000)).save(bomb, "PNG")  # 48 megapixels in a few kilobytes
    assert len(bomb.getvalue()) < 100_000
    r = cv(server, base64.b64encode(bomb.getvalue()).decode())
    assert r.status_code == 400 and "8000x6000" in r.json()["error"], r.text
    strip = io.BytesIO()
    Image.new("L", (20, 400), 255).save(strip, "PNG")  # the detector would scale it to 736 x 14720
    r = cv(server, base64.b64encode(strip.getvalue()).decode())
    assert r.status_code == 400 and "20x400" in r.json()["error"], r.text
    r = cv(server, base64.b64encode(HELLO.png).decode())
    assert r.status_code == 200, r.text
    check_read(r.json(), HELLO)


def test_missing_fields_are_400(server: ServerProcess) -> None:
    r = httpx.post(f"{server.base_url}/v1/cv", json={"model": OCR_MODEL_ID}, timeout=TIMEOUT)
    assert r.status_code == 400 and "`image`" in r.json()["error"]
    r = httpx.post(f"{server.base_url}/v1/cv", json={"image": "aGk="}, timeout=TIMEOUT)
    assert r.status_code == 400 and "`model`" in r.json()["error"]


def test_listed_with_its_capability(server: ServerProcess) -> None:
    models = httpx.get(f"{server.base_url}/v1/models", timeout=10).json()["data"]
    ocr = next(m for m in models if m["id"] == OCR_MODEL_ID)
    assert ocr["capabilities"] == ["ocr"] and ocr["engine"] == "ocr"


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime_qnn") is None, reason="needs the onnxruntime-qnn plugin")
def test_npu_reads_the_same_and_says_which_graph_ran_where(server: ServerProcess) -> None:
    """QNN's HTP backend (a simulator on x86_64) wants static shapes, and these graphs are sized per
    image: each graph runs on QNN only if QNN took a part of it at load, else on the CPU, and the
    worker's log says which."""
    r = cv(server, base64.b64encode(HELLO.png).decode(), compute="npu")
    assert r.status_code == 200, r.text
    check_read(r.json(), HELLO)
    events = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    loaded = [e for e in events if e.get("event") == "ocr model loaded" and ".npu." in e.get("worker", "")]
    assert len(loaded) == 1, loaded
    providers = loaded[0]["providers"]
    assert set(providers) == {"det", "cls", "rec"}
    assert set(providers.values()) <= {"QNNExecutionProvider", "CPUExecutionProvider"}
    if "CPUExecutionProvider" in providers.values():  # the reason is in the log
        assert any(e.get("level") == "warning" and ".npu." in e.get("worker", "") for e in events)
    r = httpx.post(f"{server.base_url}/v1/models/unload", json={"model": OCR_MODEL_ID, "compute": "npu"}, timeout=60)
    assert r.status_code == 200, r.text
