"""POST /tokenize and /detokenize (and the same under /v1/): llama-server's shapes, any model
with a tokenizer (chat and embedding models alike), chosen by `model`."""

from __future__ import annotations

from litestar import post
from litestar.di import NamedDependency
from litestar.params import RawBody

from gateway.errors import EngineFailure, Unsupported
from gateway.http.body import read_json
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from gateway.models.store import DEFAULT_MODEL_ID, ModelEntry
from gateway.supervisor.memory import worker_engine
from protocol import engines
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


def _tokenizing(services: Services, name: str | None) -> ModelEntry:
    """The model, refused before it loads when its engine has no tokenizer (protocol/engines.py)."""
    entry = services.store.resolve(name or DEFAULT_MODEL_ID)
    if not engines.info(worker_engine(entry)).tokenizer:
        raise Unsupported(f"`model`: {entry.id} ({entry.engine}) has no tokenizer")
    return entry


@post(["/tokenize", "/v1/tokenize"], status_code=200)
async def tokenize(body: RawBody, services: NamedDependency[Services]) -> TokenizeResponse:
    data = read_json(body, TokenizeRequest)
    entry = _tokenizing(services, data.model)
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
    entry = _tokenizing(services, data.model)
    worker = await services.worker(entry)
    reply = await worker.call(Detokenize(0, current_request_id() or "", data.tokens))
    if not isinstance(reply, Text):
        raise EngineFailure(f"the worker answered a detokenize with {type(reply).__name__}")
    return DetokenizeResponse(reply.content.decode(errors="replace"), entry.id)


handlers = [tokenize, detokenize]
