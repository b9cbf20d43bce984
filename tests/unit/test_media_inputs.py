"""gateway/media/inputs.py: what a request may carry as an image or audio clip, and what it may make the server fetch."""

from __future__ import annotations

import base64
import http.server
import threading
from collections.abc import Iterator

import pytest

from gateway.errors import BadRequest
from gateway.media.inputs import MediaLimits, load_media

PAYLOAD = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
NO_FETCH = MediaLimits(max_bytes=4096, fetch_hosts=frozenset())


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.1:1/elsewhere")
            self.end_headers()
            return
        body = PAYLOAD * (100 if self.path == "/big" else 1)
        self.send_response(200 if self.path in ("/ok", "/big") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://localhost:{httpd.server_address[1]}"
    httpd.shutdown()


async def test_base64_and_data_urls() -> None:
    b64 = base64.b64encode(PAYLOAD).decode()
    assert await load_media(b64, field="image", limits=NO_FETCH) == PAYLOAD
    assert await load_media(b64.rstrip("="), field="image", limits=NO_FETCH) == PAYLOAD  # padding optional
    assert await load_media(f"data:image/png;base64,{b64}", field="image", limits=NO_FETCH) == PAYLOAD
    assert await load_media("data:text/plain,hi%20there", field="image", limits=NO_FETCH) == b"hi there"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", "empty"),
        ("not base64 at all!", "neither valid base64"),
        ("data:image/png;base64", "not a valid data: URL"),
        ("data:image/png;base64,", "empty"),
        (base64.b64encode(b"x" * 5000).decode(), "at most 4096"),
        ("http://example.com/a.png", "fetches no URLs"),
    ],
)
async def test_unusable_values_are_400s_naming_the_field(value: str, words: str) -> None:
    with pytest.raises(BadRequest) as err:
        await load_media(value, field="image", limits=NO_FETCH)
    assert "`image`" in err.value.message and words in err.value.message


async def test_fetches_only_from_allowed_hosts(origin: str) -> None:
    allowed = MediaLimits(max_bytes=4096, fetch_hosts=frozenset({"localhost"}))
    assert await load_media(f"{origin}/ok", field="audio", limits=allowed) == PAYLOAD
    other = MediaLimits(max_bytes=4096, fetch_hosts=frozenset({"example.com"}))
    with pytest.raises(BadRequest, match="'localhost' is not allowed"):
        await load_media(f"{origin}/ok", field="audio", limits=other)
    # The same server by another name is another host: the list names hosts, not addresses.
    with pytest.raises(BadRequest, match=r"'127\.0\.0\.1' is not allowed"):
        await load_media(f"{origin.replace('localhost', '127.0.0.1')}/ok", field="audio", limits=allowed)


async def test_fetch_is_bounded_and_redirects_are_not_followed(origin: str) -> None:
    allowed = MediaLimits(max_bytes=4096, fetch_hosts=frozenset({"localhost"}))
    with pytest.raises(BadRequest, match="larger than 4096 bytes"):
        await load_media(f"{origin}/big", field="audio", limits=allowed)
    with pytest.raises(BadRequest, match="answered 302"):
        await load_media(f"{origin}/redirect", field="audio", limits=allowed)
    with pytest.raises(BadRequest, match="answered 404"):
        await load_media(f"{origin}/missing", field="audio", limits=allowed)
