"""A request's priority (protocol/priority.py): the `GenieX-Priority` header, else the models
file's default for the model, else `normal`; never above its API key's `priority=`, whatever the
header says, so that a key given to a background agent cannot jump the person's queue."""

from __future__ import annotations

from typing import cast

from litestar.connection import ASGIConnection

from gateway.errors import BadRequest
from gateway.http.auth import KEY_PRIORITY
from protocol.priority import DEFAULT, HEADER, PRIORITIES, Priority, capped


def priority_of(request: ASGIConnection, default: Priority | None = None) -> Priority:
    """The priority `request` runs at; a header that names no priority is a 400."""
    header = request.headers.get(HEADER)
    asked: Priority | None = None
    if header is not None:
        header = header.strip().lower()
        if header not in PRIORITIES:
            raise BadRequest(f"`{HEADER}` header: {header[:32]!r} is not one of {', '.join(PRIORITIES)}")
        asked = cast("Priority", header)
    ceiling = request.scope.get("state", {}).get(KEY_PRIORITY)
    return capped(asked or default or DEFAULT, ceiling)
