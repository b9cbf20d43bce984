"""GenieX's own request and response headers, shared by every dialect's routes."""

from __future__ import annotations

import re

import structlog
from litestar import Request

KEEP_CACHE_HEADER = "geniex-keepcache"
# `false`: run on the asked `compute` unit or answer 400 with the reason, never on the CPU instead.
COMPUTE_FALLBACK_HEADER = "geniex-compute-fallback"
NOT_OFFERED_HEADER = "GenieX-Tools-Not-Offered"

log = structlog.get_logger("gateway.tools")


def header_true(request: Request, name: str) -> bool:
    return request.headers.get(name, "").strip().lower() in ("1", "true", "yes")


def header_flag(request: Request, name: str) -> bool | None:
    """A yes/no header; None when absent or neither."""
    value = request.headers.get(name, "").strip().lower()
    return True if value in ("1", "true", "yes") else False if value in ("0", "false", "no") else None


def not_offered_headers(names: list[str]) -> dict[str, str]:
    """The headers that name the tools a request offered but the model was not (and the log line):
    the agent dialects' one place to say so, since neither API has a field for it."""
    if not names:
        return {}
    log.info("tools not offered", tools=names)
    # A client's own strings: printable ASCII only (no header injection), and bounded.
    value = re.sub(r"[^\x20-\x7e]", "?", ", ".join(names))
    return {NOT_OFFERED_HEADER: value if len(value) <= 1024 else value[:1020] + " ..."}
