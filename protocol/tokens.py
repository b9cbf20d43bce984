"""`/tokenize` and `/detokenize` (also under `/v1/`), in llama-server's shapes, with `model` added."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from protocol.limits import TokenId

# One request's text or ids: tokenizing runs between a worker's decode steps, so it stays short
# (a mebibyte of text tokenizes in tens of milliseconds).
MAX_TOKENIZE_CHARS = 1 << 20
MAX_DETOKENIZE_IDS = 1 << 20


class TokenizeRequest(msgspec.Struct, kw_only=True):
    content: Annotated[str, Meta(max_length=MAX_TOKENIZE_CHARS)]
    model: str | None = None  # absent: the bundled default model
    add_special: bool = False  # the BOS (and EOS) the model adds to a prompt
    parse_special: bool = True  # `<|im_start|>` in the text is that one special token
    with_pieces: bool = False


class Piece(msgspec.Struct):
    id: int
    piece: str | list[int]  # the token's text, or its bytes when they are not valid UTF-8 alone


class TokenizeResponse(msgspec.Struct):
    tokens: list[int] | list[Piece]
    model: str


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    tokens: Annotated[list[TokenId], Meta(max_length=MAX_DETOKENIZE_IDS)]
    model: str | None = None


class DetokenizeResponse(msgspec.Struct):
    content: str
    model: str
