"""The JSON encoder for bodies and SSE payloads the handlers encode themselves (one per process)."""

from __future__ import annotations

import msgspec

encode = msgspec.json.Encoder().encode
