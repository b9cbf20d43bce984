"""OpenAI's Conversations API and the stored Responses' lists: the wire shapes only.

A conversation holds items (the Responses API's input and output items, each with an `id`), read
as the history of a response created with `conversation` and appended to by it. Items are kept as
the JSON objects a client sent (checked as `protocol/responses.py`'s `InputItem` first), so a list
gives them back as they came, with the `id` and `status` the server gave them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from protocol.limits import MAX_MESSAGES
from protocol.responses import Metadata, ResponsesRequest

MAX_ITEMS_PER_CALL = 20  # OpenAI's: "You may add up to 20 items at a time"

Items = Annotated[list[dict[str, Any]], Meta(max_length=MAX_ITEMS_PER_CALL)]


class ConversationCreate(msgspec.Struct, kw_only=True):
    items: Items | None = None
    metadata: Metadata | None = None


class ConversationUpdate(msgspec.Struct, kw_only=True):
    metadata: Metadata


class ItemsCreate(msgspec.Struct, kw_only=True):
    items: Items


class Conversation(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str] = msgspec.field(default_factory=dict)


class ConversationDeleted(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["conversation.deleted"] = "conversation.deleted"
    deleted: bool = True


class ItemList(msgspec.Struct, kw_only=True):
    """A page of items, OpenAI's cursor list: `after` the last id of a page gets the next."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class InputTokensRequest(ResponsesRequest, kw_only=True):
    """`POST /v1/responses/input_tokens`: a create request's fields, all optional as the SDK sends
    them; `model` is still needed here (its tokenizer counts)."""

    model: Annotated[str, Meta(max_length=512)] | None = None  # type: ignore[assignment]
    input: str | Annotated[list[dict[str, Any]], Meta(max_length=MAX_MESSAGES)] = msgspec.field(default_factory=list)


class InputTokens(msgspec.Struct, kw_only=True):
    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int
