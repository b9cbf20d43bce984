"""Items as they are kept and listed: a request's `input` (and a conversation's items) checked as
input items, then given the `id` and `status` OpenAI's lists show, with a message's string content
as the one text part it means; and OpenAI's cursor pages over them (`after`, `limit`, `order`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.dialects.responses.translate import input_items, new_id
from gateway.errors import BadRequest
from protocol import responses as r
from protocol.conversations import ItemList

_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs",
           "mcp_approval_response": "mcpr", "mcp_list_tools": "mcpl", "mcp_call": "mcp",
           "mcp_approval_request": "mcpr"}  # fmt: skip

MAX_LIMIT = 100


def kept_items(raw: str | list[dict[str, Any]], field: str = "input") -> list[dict[str, Any]]:
    """The items of `raw` (a request's `input`, a conversation's `items`), checked (a 400 naming
    `field[i]`), as listed."""
    try:
        return [_listed(item) for item in input_items(raw)]
    except BadRequest as exc:
        if field != "input" and exc.message.startswith("`input["):  # translate names the create's field
            exc.message = f"`{field}[" + exc.message.removeprefix("`input[")
        raise


def output_items(output: list[r.OutputItem]) -> list[dict[str, Any]]:
    return [msgspec.to_builtins(item) for item in output]


def _listed(item: r.InputItem) -> dict[str, Any]:
    obj: dict[str, Any] = msgspec.to_builtins(item)
    kind = obj["type"]
    if not obj.get("id"):
        obj["id"] = new_id(_PREFIX.get(kind, "item"))
    if "status" in obj and obj["status"] is None:
        obj["status"] = "completed"
    if kind == "message":
        obj.setdefault("status", "completed")
        if isinstance(obj["content"], str):
            part = "output_text" if obj["role"] == "assistant" else "input_text"
            extra: dict[str, Any] = {"annotations": []} if part == "output_text" else {}
            obj["content"] = [{"type": part, "text": obj["content"], **extra}]
    return {k: v for k, v in obj.items() if v is not None}


def page_params(limit: int | None, order: str | None, default_order: str = "desc") -> tuple[int, bool]:
    """`limit` (1-100, default 20) and whether the order is ascending, or a 400 naming the field."""
    n = 20 if limit is None else limit
    if not 1 <= n <= MAX_LIMIT:
        raise BadRequest(f"`limit`: {n} is not between 1 and {MAX_LIMIT}")
    order = order or default_order
    if order not in ("asc", "desc"):
        raise BadRequest(f"`order`: {order[:32]!r} is neither `asc` nor `desc`")
    return n, order == "asc"


def page(items: list[dict[str, Any]], after: str | None, limit: int | None, order: str | None) -> ItemList:
    """A page of `items` (oldest first), OpenAI's list shape; `after` an id not among them is a 400."""
    n, ascending = page_params(limit, order)
    ordered = items if ascending else items[::-1]
    start = 0
    if after:
        at = next((i for i, item in enumerate(ordered) if item.get("id") == after), None)
        if at is None:
            raise BadRequest(f"`after`: no item {after[:128]!r} in this list")
        start = at + 1
    data = ordered[start : start + n]
    return ItemList(data=data, first_id=data[0]["id"] if data else None, last_id=data[-1]["id"] if data else None,
                    has_more=start + n < len(ordered))  # fmt: skip
