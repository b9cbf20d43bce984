"""The spec's ErrorResponse: `{"error": "<message>"}`, status carries the class."""

from __future__ import annotations

import msgspec


class ErrorResponse(msgspec.Struct, omit_defaults=True):
    error: str
    code: str | None = None
    request_id: str | None = None
