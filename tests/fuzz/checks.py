"""The checks every fuzzed response passes, beyond the spec's own schemas."""

from __future__ import annotations

import json
from typing import Any

from schemathesis import Case, CheckContext, Response


def error_body(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Every refusal is the spec's ErrorResponse: a JSON object with an `error` string. The spec
    documents few error statuses per route, so schemathesis cannot check these bodies itself."""
    if response.status_code < 400:
        return None
    try:
        body: Any = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"{response.status_code} without a JSON body: {response.content[:200]!r}") from None
    if not isinstance(body, dict) or not isinstance(body.get("error"), str):
        raise AssertionError(f"{response.status_code} body is not an ErrorResponse: {body!r:.200}")
    return True
