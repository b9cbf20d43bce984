"""What a generated case may cost: the bundled model, a few tokens, the server's own context.

Generated values the server would legitimately spend time on are brought down to a bounded
cost; values it must refuse (zero, negative, beyond 32 bits, wrong types) are left as they are,
so the fuzzer still sends them.
"""

from __future__ import annotations

from typing import Any

from gateway.models.store import OCR_MODEL_ID
from protocol.limits import INT32_MAX

MAX_TOKENS = 4
MAX_INPUT_IDS = 16  # logits rows: with top_n 0 each is the whole vocabulary (49152 floats)
TOKEN_FIELDS = ("max_completion_tokens", "max_tokens")


def _in_range(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= INT32_MAX


def bound_body(path: str, body: Any, model: str, nctx: int) -> None:
    """Bound a generated request body in place."""
    if not isinstance(body, dict):
        return
    # Any other name is a 400 or 404 at once; the interesting paths start with a model that loads.
    if isinstance(body.get("model"), str):
        body["model"] = OCR_MODEL_ID if path == "/v1/cv" else model
    for key in TOKEN_FIELDS:
        if _in_range(body.get(key)):
            body[key] = min(body[key], MAX_TOKENS)
    if path == "/v1/chat/completions" and all(body.get(key) is None for key in TOKEN_FIELDS):
        # Unbounded, SmolLM2 talks until the context is full: seconds per case (15 s on a busy box).
        # A null limit is no limit too (the spec's fields are nullable, and the fuzzer sends null):
        # the other field is set instead, so the null is still sent; max_completion_tokens wins
        # over max_tokens when both are numbers (gateway/chat/convert.py).
        absent = [key for key in TOKEN_FIELDS if key not in body]
        body[absent[0] if absent else TOKEN_FIELDS[0]] = MAX_TOKENS
    # Another valid nctx starts another worker (0.6 s and about 1.3 GB of estimate each).
    if _in_range(body.get("nctx")):
        body["nctx"] = nctx
    ids = body.get("input_ids")
    if isinstance(ids, list) and len(ids) > MAX_INPUT_IDS:
        del ids[MAX_INPUT_IDS:]
