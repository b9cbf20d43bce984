"""`/v1/conversations`: OpenAI's Conversations API, read like its spec: a conversation with
metadata and items (create with up to 20, add up to 20 at a time, list, retrieve, delete one).
A response created with `conversation` reads its items as history and appends its input and
output items (gateway/dialects/responses/routes.py). Kept in the store beside the responses, per
caller and bounded per caller (gateway/dialects/responses/store.py).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, RawBody

from gateway.dialects.responses.items import kept_items, page_params
from gateway.dialects.responses.state import ResponsesState
from gateway.errors import NotFound
from gateway.http.auth import tenant_of
from gateway.http.body import read_json
from protocol.conversations import (
    Conversation,
    ConversationCreate,
    ConversationDeleted,
    ConversationUpdate,
    ItemList,
    ItemsCreate,
)

EVICTED_HEADER = "GenieX-Evicted-Conversations"
KEPT = ("conversations are kept for the key that made them, as long as its bounds keep them: "
        "--conversations-store-max, --conversations-store-mb")  # fmt: skip


def _missing(conversation_id: str) -> NotFound:
    return NotFound(f"`conversation_id`: no conversation {conversation_id[:128]!r} ({KEPT})")


def _evicted(ids: list[str] | None) -> dict[str, str]:
    return {EVICTED_HEADER: ",".join(ids[:16])} if ids else {}


@post("/v1/conversations", status_code=200)
async def create_conversation(request: Request, body: RawBody,
                              kept: NamedDependency[ResponsesState]) -> Response[Conversation]:  # fmt: skip
    data = read_json(body, ConversationCreate)
    items = kept_items(data.items, "items") if data.items else []
    conv, evicted = await kept.store.create_conversation(tenant_of(request), data.metadata or {}, items)
    return Response(conv, headers=_evicted(evicted))


@get("/v1/conversations/{conversation_id:str}")
async def retrieve_conversation(request: Request, conversation_id: FromPath[str],
                                kept: NamedDependency[ResponsesState]) -> Response[Conversation]:  # fmt: skip
    conv = await kept.store.conversation(tenant_of(request), conversation_id)
    if conv is None:
        raise _missing(conversation_id)
    return Response(conv)


@post("/v1/conversations/{conversation_id:str}", status_code=200)
async def update_conversation(request: Request, conversation_id: FromPath[str], body: RawBody,
                              kept: NamedDependency[ResponsesState]) -> Response[Conversation]:  # fmt: skip
    data = read_json(body, ConversationUpdate)
    conv = await kept.store.update_conversation(tenant_of(request), conversation_id, data.metadata)
    if conv is None:
        raise _missing(conversation_id)
    return Response(conv)


@delete("/v1/conversations/{conversation_id:str}", status_code=200)
async def delete_conversation(request: Request, conversation_id: FromPath[str],
                              kept: NamedDependency[ResponsesState]) -> Response[ConversationDeleted]:  # fmt: skip
    if not await kept.store.delete_conversation(tenant_of(request), conversation_id):
        raise _missing(conversation_id)
    return Response(ConversationDeleted(id=conversation_id))


@get("/v1/conversations/{conversation_id:str}/items")
async def list_items(request: Request, conversation_id: FromPath[str], kept: NamedDependency[ResponsesState],
                     after: FromQuery[str | None] = None, limit: FromQuery[int | None] = None,
                     order: FromQuery[str | None] = None) -> Response[ItemList]:  # fmt: skip
    """Newest first unless `order=asc`; `include` is accepted and not read (no item here has more to include)."""
    n, ascending = page_params(limit, order)
    items = await kept.store.list_items(tenant_of(request), conversation_id, after, n, ascending)
    if items is None:
        raise _missing(conversation_id)
    return Response(items)


@post("/v1/conversations/{conversation_id:str}/items", status_code=200)
async def add_items(request: Request, conversation_id: FromPath[str], body: RawBody,
                    kept: NamedDependency[ResponsesState]) -> Response[ItemList]:  # fmt: skip
    data = read_json(body, ItemsCreate)
    items = kept_items(data.items, "items")
    evicted = await kept.store.add_items(tenant_of(request), conversation_id, items)
    if evicted is None:
        raise _missing(conversation_id)
    listed = ItemList(data=items, first_id=items[0]["id"] if items else None,
                      last_id=items[-1]["id"] if items else None)  # fmt: skip
    return Response(listed, headers=_evicted(evicted))


@get("/v1/conversations/{conversation_id:str}/items/{item_id:str}")
async def retrieve_item(request: Request, conversation_id: FromPath[str], item_id: FromPath[str],
                        kept: NamedDependency[ResponsesState]) -> Response[dict[str, Any]]:  # fmt: skip
    owner = tenant_of(request)
    item = await kept.store.item(owner, conversation_id, item_id)
    if item is None:
        if await kept.store.conversation(owner, conversation_id) is None:
            raise _missing(conversation_id)
        raise NotFound(f"`item_id`: no item {item_id[:128]!r} in conversation {conversation_id[:128]!r}")
    return Response(item)


@delete("/v1/conversations/{conversation_id:str}/items/{item_id:str}", status_code=200)
async def delete_item(request: Request, conversation_id: FromPath[str], item_id: FromPath[str],
                      kept: NamedDependency[ResponsesState]) -> Response[Conversation]:  # fmt: skip
    """The conversation, as OpenAI answers it, once the item is gone."""
    owner = tenant_of(request)
    conv = await kept.store.delete_item(owner, conversation_id, item_id)
    if conv is None:
        if await kept.store.conversation(owner, conversation_id) is None:
            raise _missing(conversation_id)
        raise NotFound(f"`item_id`: no item {item_id[:128]!r} in conversation {conversation_id[:128]!r}")
    return Response(conv)


handlers = [create_conversation, retrieve_conversation, update_conversation, delete_conversation, list_items,
            add_items, retrieve_item, delete_item]  # fmt: skip
