"""Images in chat, the parts that need no model: reading and checking a request's images (gateway),
turning content parts into the worker's message shape, and the worker's prompt keys for images."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
from PIL import Image

from gateway.chat.convert import _message_dict
from gateway.errors import BadRequest
from gateway.media.images import MAX_IMAGES, chat_images, decode, image_parts, read_image
from gateway.media.inputs import MediaLimits
from protocol.chat import ChatMessage, ContentPart, ImageURL
from protocol.wire import ImageInput
from workers.engines.llama.media import flatten, image_key, text_run, whole_media

NO_FETCH = MediaLimits(1 << 20, frozenset())


def encoded(img: Image.Image, fmt: str = "PNG", **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def image_message(*urls: str) -> ChatMessage:
    parts = [ContentPart(type="image_url", image_url=ImageURL(url=u)) for u in urls]
    return ChatMessage(role="user", content=[*parts, ContentPart(type="text", text="what is it?")])


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_each_format_decodes_to_rgb_pixels(fmt: str) -> None:
    img = decode(encoded(Image.new("RGB", (20, 10), (255, 0, 0)), fmt), "f", 1024)
    assert (img.width, img.height) == (20, 10) and len(img.rgb) == 20 * 10 * 3
    r, g, b = img.rgb[:3]
    assert r > 200 and g < 60 and b < 60


def test_a_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (8, 8), c) for c in ((0, 255, 0), (255, 0, 0))]
    data = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:])
    r, g, _ = decode(data, "f", 1024).rgb[:3]
    assert g > 200 and r < 60


def test_transparency_shows_as_white_and_large_images_shrink() -> None:
    img = decode(encoded(Image.new("RGBA", (8, 8), (0, 0, 0, 0))), "f", 1024)
    assert img.rgb[:3] == b"\xff\xff\xff"
    small = decode(encoded(Image.new("RGB", (400, 100))), "f", 200)
    assert (small.width, small.height) == (200, 50)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"not an image", "could not be read"),
        (encoded(Image.new("RGB", (8, 8)), "BMP"), "could not be read"),  # not an allowed format
        (encoded(Image.new("RGB", (64, 64)))[:50], "could not be"),
    ],
)
def test_bad_images_are_a_400_naming_the_field(data: bytes, words: str) -> None:
    with pytest.raises(BadRequest) as err:
        decode(data, "messages[0].content[0].image_url", 1024)
    assert "`messages[0].content[0].image_url`" in err.value.message and words in err.value.message


def test_image_parts_name_each_part() -> None:
    msgs = [ChatMessage(role="system", content="hi"), image_message("data:a", "data:b")]
    assert image_parts(msgs) == [("messages[1].content[0].image_url", "data:a"),
                                 ("messages[1].content[1].image_url", "data:b")]  # fmt: skip
    with pytest.raises(BadRequest, match=r"needs `image_url\.url`"):
        image_parts([ChatMessage(role="user", content=[ContentPart(type="image_url")])])


def test_local_files_only_inside_a_media_dir(tmp_path: Path) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "ok.png").write_bytes(b"png")
    (outside / "secret.png").write_bytes(b"secret")
    (allowed / "escape.png").symlink_to(outside / "secret.png")

    def read(url: str, dirs: list[Path]) -> bytes:
        return asyncio.run(read_image(url, "f", NO_FETCH, dirs))

    assert read(f"file://{allowed / 'ok.png'}", [allowed]) == b"png"
    assert read(str(allowed / "ok.png"), [allowed]) == b"png"
    for url, dirs, words in [
        (str(allowed / "ok.png"), [], "reads no local files"),
        (f"file://{outside / 'secret.png'}", [allowed], "outside the folders"),
        (str(allowed / "escape.png"), [allowed], "outside the folders"),
        (f"file://{allowed}/../outside/secret.png", [allowed], "outside the folders"),
        (str(allowed / "missing.png"), [allowed], "no such image"),
        ("ftp://host/x.png", [allowed], "data: URL"),
        ("http://example.com/x.png", [allowed], "fetches no URLs"),
    ]:
        with pytest.raises(BadRequest, match=words):
            read(url, dirs)


def test_chat_images_refuses_a_model_without_vision_and_too_many_images() -> None:
    png = "data:image/png;base64,iVBORw0KGgo="

    def run(msgs: list[ChatMessage], vision: bool) -> list[ImageInput]:
        return asyncio.run(chat_images(msgs, model_id="m", vision=vision, limits=NO_FETCH, media_dirs=[],
                                       max_length=None))  # fmt: skip

    assert run([ChatMessage(role="user", content="text only")], vision=False) == []
    with pytest.raises(BadRequest, match="has no vision"):
        run([image_message(png)], vision=False)
    with pytest.raises(BadRequest, match=f"at most {MAX_IMAGES}"):
        run([image_message(*[png] * (MAX_IMAGES + 1))], vision=True)


def test_message_content_keeps_where_images_go() -> None:
    d = _message_dict(0, image_message("data:x"))
    assert d["content"] == [{"type": "image"}, {"type": "text", "text": "what is it?"}]
    text_only = ChatMessage(
        role="user", content=[ContentPart(type="text", text="a"), ContentPart(type="text", text="b")]
    )
    assert _message_dict(0, text_only)["content"] == "ab"
    audio = ChatMessage(role="user", content=[ContentPart(type="input_audio")])
    with pytest.raises(BadRequest, match="audio encoder"):
        _message_dict(0, audio)


def test_worker_flattens_parts_with_its_marker() -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c"}]  # fmt: skip
    flat, n = flatten(msgs, "<M>")
    assert n == 1 and flat[0]["content"] == "a<M>b" and flat[1] == msgs[1]


def test_image_keys_come_from_content_and_prefixes_never_split_an_image() -> None:
    red, red2, green = (ImageInput(2, 1, px) for px in (b"\xff\0\0" * 2, b"\xff\0\0" * 2, b"\0\xff\0" * 2))
    assert image_key(red) == image_key(red2) < 0 and image_key(red) != image_key(green)
    k = image_key(red)
    keys = [1, 2, k, k, k, 3]
    assert text_run(keys) == 2 and text_run(keys[5:]) == 1
    assert [whole_media(keys, n) for n in range(7)] == [0, 1, 2, 2, 2, 5, 6]
