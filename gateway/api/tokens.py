"""POST /tokenize and /detokenize (and the same under /v1/): llama-server's shapes, any model
with a tokenizer (chat and embedding models alike), chosen by `model`."""

from __future__ import annotations

from litestar import post
from litestar.di import NamedDependency
from litestar.params import RawBody

from gateway.api.body import read_json
from gateway.api.request_id import current_request_id
from gateway.api.services import Services
from gateway.errors import EngineFailure
from gateway.models.store import DEFAULT_MODEL_ID
from protocol.tokens import (
    DetokenizeRequest,
    DetokenizeResponse,
    Piece,
    TokenizeRequest,
    TokenizeResponse,
)
from protocol.wire import Detokenize, Text, Tokenize, TokenList


def _piece(token: int, raw: bytes) -> Piece:
    try:
        return Piece(token, raw.decode())
    except UnicodeDecodeError:  # part of a character: llama-server sends the bytes then
        return Piece(token, list(raw))


@post(["/tokenize", "/v1/tokenize"], status_code=200)
async def tokenize(body: RawBody, services: NamedDependency[Services]) -> TokenizeResponse:
    data = read_json(body, TokenizeRequest)
    entry = services.store.resolve(data.model or DEFAULT_MODEL_ID)
    worker = await services.worker(entry)
    msg = Tokenize(0, current_request_id() or "", data.content, data.add_special, data.parse_special, data.with_pieces)
    reply = await worker.call(msg)
    if not isinstance(reply, TokenList):
        raise EngineFailure(f"the worker answered a tokenize with {type(reply).__name__}")
    if data.with_pieces:
        return TokenizeResponse([_piece(t, p) for t, p in zip(reply.tokens, reply.pieces, strict=True)], entry.id)
    return TokenizeResponse(reply.tokens, entry.id)


@post(["/detokenize", "/v1/detokenize"], status_code=200)
async def detokenize(body: RawBody, services: NamedDependency[Services]) -> DetokenizeResponse:
    data = read_json(body, DetokenizeRequest)
    entry = services.store.resolve(data.model or DEFAULT_MODEL_ID)
    worker = await services.worker(entry)
    reply = await worker.call(Detokenize(0, current_request_id() or "", data.tokens))
    if not isinstance(reply, Text):
        raise EngineFailure(f"the worker answered a detokenize with {type(reply).__name__}")
    return DetokenizeResponse(reply.content.decode(errors="replace"), entry.id)


handlers = [tokenize, detokenize]
