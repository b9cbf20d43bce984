"""Media a request names: base64, a `data:` URL, or an http(s) URL on a host the operator allowed.

Fetching a URL on a client's behalf is a server-side request forgery risk (the server can reach
loopback services and the LAN that the client cannot), so it is off until the operator lists hosts
with `--fetch-host`; redirects are not followed, and the size and time are bounded.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes, urlsplit

import httpx

from gateway.errors import BadRequest

_DATA_URL = re.compile(r"^data:([^,;]*)((?:;[^,;]*)*),", re.IGNORECASE)
_WHITESPACE = re.compile(rb"\s+")


@dataclass(frozen=True, slots=True)
class MediaLimits:
    max_bytes: int  # decoded size of one image or audio clip
    fetch_hosts: frozenset[str]  # lower-case host names URLs may name; empty: no fetching
    timeout_s: float = 10.0


def _b64(text: str, field: str) -> bytes:
    raw = _WHITESPACE.sub(b"", text.encode("ascii", "replace"))
    try:
        return base64.b64decode(raw + b"=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"`{field}` is neither valid base64, a data: URL nor an http(s) URL") from None


def _checked(data: bytes, field: str, limits: MediaLimits) -> bytes:
    if not data:
        raise BadRequest(f"`{field}` is empty")
    if len(data) > limits.max_bytes:
        raise BadRequest(f"`{field}` holds {len(data)} bytes; at most {limits.max_bytes} are accepted")
    return data


async def _fetch(url: str, field: str, limits: MediaLimits) -> bytes:
    host = (urlsplit(url).hostname or "").lower()
    if not limits.fetch_hosts:
        raise BadRequest(f"`{field}`: this server fetches no URLs (the operator can allow hosts with --fetch-host); "
                         "send the content as base64 or a data: URL")  # fmt: skip
    if host not in limits.fetch_hosts:
        raise BadRequest(f"`{field}`: fetching from {host!r} is not allowed on this server")
    data = bytearray()
    try:
        async with (
            httpx.AsyncClient(timeout=limits.timeout_s, follow_redirects=False, trust_env=False) as client,
            client.stream("GET", url) as reply,
        ):
            if reply.status_code != 200:
                raise BadRequest(f"`{field}`: {host} answered {reply.status_code} for the URL")
            async for chunk in reply.aiter_bytes():
                data += chunk
                if len(data) > limits.max_bytes:
                    raise BadRequest(f"`{field}`: the URL's content is larger than {limits.max_bytes} bytes")
    except httpx.TimeoutException:
        raise BadRequest(f"`{field}`: {host} did not answer within {limits.timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise BadRequest(f"`{field}`: could not fetch the URL from {host} ({type(exc).__name__})") from None
    return bytes(data)


async def load_media(value: str, *, field: str, limits: MediaLimits) -> bytes:
    """The bytes `value` carries or names; a 400 naming `field` for anything unusable."""
    text = value.strip()
    if not text:
        raise BadRequest(f"`{field}` is empty")
    head = text[:8].lower()
    if head.startswith(("http://", "https://")):
        return _checked(await _fetch(text, field, limits), field, limits)
    if head.startswith("data:"):
        m = _DATA_URL.match(text)
        if m is None:
            raise BadRequest(f"`{field}` is not a valid data: URL (expected data:<type>;base64,<data>)")
        payload = text[m.end() :]
        if ";base64" in m.group(2).lower():
            return _checked(_b64(payload, field), field, limits)
        return _checked(unquote_to_bytes(payload), field, limits)
    if len(text) > limits.max_bytes * 4 // 3 + 4:
        raise BadRequest(f"`{field}` holds more than {limits.max_bytes} bytes; at most {limits.max_bytes} are accepted")
    return _checked(_b64(text, field), field, limits)
