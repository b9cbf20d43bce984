"""The images of a chat request (`image_url` parts), read, checked and made small for a vision model.

An image comes as a `data:` URL, an http(s) URL on a host the operator allowed (`--fetch-host`,
through `load_media`), or a local file inside a folder the operator allowed (`--media-dir`; a
`file://` URL or an absolute path). Pillow decodes it (PNG, JPEG, WebP, or a GIF's first frame)
within a pixel bound, upright as its EXIF says, as RGB; it is shrunk so that its longer side is at
most the request's `image_max_length`, and travels to the worker as raw pixels.
"""

from __future__ import annotations

import asyncio
import io
import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from gateway.errors import BadRequest
from gateway.media.inputs import MediaLimits, load_media
from protocol.chat import ChatMessage
from protocol.wire import ImageInput

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
MAX_IMAGE_PIXELS = 40_000_000  # what Pillow may decode of one image (the OCR route's bound)
MAX_IMAGES = 16  # per request: each is an encoder pass in the worker
DEFAULT_MAX_LENGTH = 1024  # the longer side without `image_max_length`; the projector resizes again
MAX_LENGTH = 4096  # the most `image_max_length` may ask for


def image_parts(messages: list[ChatMessage]) -> list[tuple[str, str]]:
    """(field name, url) of every `image_url` part, in order."""
    out = []
    for i, m in enumerate(messages):
        if isinstance(m.content, list):
            for j, part in enumerate(m.content):
                if part.type == "image_url":
                    field = f"messages[{i}].content[{j}].image_url"
                    if part.image_url is None or not part.image_url.url:
                        raise BadRequest(f"`{field}`: an image_url part needs `image_url.url`")
                    out.append((field, part.image_url.url))
    return out


def _local_path(url: str, field: str, media_dirs: list[Path]) -> Path:
    """A local file a request named, only inside an allowed folder (after symlinks are resolved)."""
    path = unquote(urlsplit(url).path) if url.lower().startswith("file:") else url
    if not media_dirs:
        raise BadRequest(f"`{field}`: this server reads no local files (the operator can allow folders with "
                         "--media-dir); send the image as a data: URL")  # fmt: skip
    if "\x00" in path or not os.path.isabs(path):
        raise BadRequest(f"`{field}`: a local image is an absolute path or a file:// URL")
    real = Path(os.path.realpath(path))
    if not any(real.is_relative_to(Path(os.path.realpath(d))) for d in media_dirs):
        raise BadRequest(f"`{field}`: the path is outside the folders this server reads images from")
    if not real.is_file():
        raise BadRequest(f"`{field}`: no such image file")
    return real


async def read_image(url: str, field: str, limits: MediaLimits, media_dirs: list[Path]) -> bytes:
    head = url.lstrip()[:8].lower()
    if head.startswith(("data:", "http://", "https://")):
        return await load_media(url, field=field, limits=limits)
    if head.startswith("file:") or url.startswith("/"):
        real = _local_path(url, field, media_dirs)
        size = real.stat().st_size
        if size > limits.max_bytes:
            raise BadRequest(f"`{field}` holds {size} bytes; at most {limits.max_bytes} are accepted")
        return await asyncio.to_thread(real.read_bytes)
    raise BadRequest(f"`{field}`: an image is a data: URL, an http(s) URL or a local file:// URL")


def decode(data: bytes, field: str, max_length: int) -> ImageInput:
    """The image as RGB pixels, its longer side at most `max_length`; a 400 naming `field` otherwise."""
    from PIL import Image, ImageOps  # Pillow is slow to import; only vision requests need it

    try:
        file = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except Image.DecompressionBombError:
        raise BadRequest(f"`{field}`: the image is too large") from None
    except Exception:  # noqa: BLE001 - Pillow raises many kinds for bytes it cannot read
        raise BadRequest(f"`{field}` could not be read as an image ({', '.join(IMAGE_FORMATS)})") from None
    width, height = file.size
    if width < 1 or height < 1:
        raise BadRequest(f"`{field}`: the image has no pixels")
    if width * height > MAX_IMAGE_PIXELS:
        raise BadRequest(f"`{field}`: the image is {width}x{height} pixels; at most {MAX_IMAGE_PIXELS:,} are read")
    try:
        file.seek(0)  # a GIF's (or animated WebP's) first frame
        file.load()
        img = ImageOps.exif_transpose(file)
        if "A" in img.getbands() or "transparency" in img.info:
            rgba = img.convert("RGBA")
            img = Image.new("RGB", rgba.size, (255, 255, 255))  # transparency shows as white
            img.paste(rgba, mask=rgba.getchannel("A"))
        else:
            img = img.convert("RGB")
        if max(img.size) > max_length:
            img.thumbnail((max_length, max_length), Image.Resampling.BICUBIC)
    except Exception as exc:  # noqa: BLE001 - truncated or corrupt data fails here, not at open
        raise BadRequest(f"`{field}` could not be decoded as an image ({type(exc).__name__})") from None
    return ImageInput(img.width, img.height, img.tobytes())


async def chat_images(messages: list[ChatMessage], *, model_id: str, vision: bool, limits: MediaLimits,
                      media_dirs: list[Path], max_length: int | None,
                      fields: list[str] | None = None) -> list[ImageInput]:  # fmt: skip
    """The request's images, in the order of their parts; [] for a request without any. A dialect
    translated into chat messages names its own last images in `fields` (errors then say where
    they are in the request the client sent)."""
    parts = image_parts(messages)
    if fields:
        own = parts[len(parts) - len(fields) :]
        parts = parts[: len(parts) - len(own)] + [
            (f, url) for f, (_, url) in zip(fields[-len(own) :], own, strict=True)
        ]
    if not parts:
        return []
    if not vision:
        raise BadRequest(f"`{parts[0][0]}`: {model_id} has no vision (no multimodal projector); "
                         "images need a vision model (see `vision` in /v1/models)")  # fmt: skip
    if len(parts) > MAX_IMAGES:
        raise BadRequest(f"`messages`: {len(parts)} images; at most {MAX_IMAGES} are accepted in one request")
    longest = min(max_length or DEFAULT_MAX_LENGTH, MAX_LENGTH)
    out = []
    for field, url in parts:
        data = await read_image(url, field, limits, media_dirs)
        out.append(await asyncio.to_thread(decode, data, field, longest))
    return out
