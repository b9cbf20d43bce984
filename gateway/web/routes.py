"""The web UI's routes: five HTML pages and the static assets, each sent with a strict CSP."""

from __future__ import annotations

from pathlib import Path

from litestar import MediaType, Request, Response, Router, get
from litestar.datastructures import CacheControlHeader
from litestar.handlers import HTTPRouteHandler
from litestar.static_files import create_static_files_router

HERE = Path(__file__).parent
PAGES = HERE / "pages"
STATIC = HERE / "static"

# No inline script or style, nothing from another origin: model output that slipped past the
# sanitizer could neither run code nor make the browser fetch from (or leak to) another host.
# blob: and data: are for what the page makes itself (a WAV to play, a generated PNG, Swagger UI's icons).
CSP = "; ".join([
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data: blob:",
    "media-src 'self' blob:",
    "font-src 'self'",
    "connect-src 'self'",
    "manifest-src 'self'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])  # fmt: skip
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
# Paths the web UI serves; open without an API key (they hold no data: the pages ask the API for it).
PAGE_PATHS = {"/": "index.html", "/voice": "voice.html", "/ops": "ops.html", "/try": "try.html", "/docs": "docs.html"}
STATIC_PREFIX = "/static/"


async def _secure(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def _page(path: str, file: str) -> HTTPRouteHandler:
    html = (PAGES / file).read_bytes()

    @get(path, name=f"web:{file}", include_in_schema=False, media_type=MediaType.HTML,
         cache_control=CacheControlHeader(no_cache=True))  # fmt: skip
    async def page(request: Request) -> Response[bytes]:
        return Response(html, media_type=MediaType.HTML)

    return page


def router() -> Router:
    static = create_static_files_router(
        path="/static", directories=[STATIC], name="web:static", after_request=_secure,
        cache_control=CacheControlHeader(max_age=3600),
    )  # fmt: skip
    pages = [_page(path, file) for path, file in PAGE_PATHS.items()]
    return Router(path="/", route_handlers=[*pages, static], after_request=_secure)
