"""POST /v1/logits: one forward pass on the model's worker, rows relayed as JSON."""

from __future__ import annotations

import asyncio
import sys
from array import array
from collections.abc import Iterator
from typing import Any

import structlog
from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import RawBody

from gateway.errors import BadRequest
from gateway.http.auth import caller_of
from gateway.http.body import read_json
from gateway.http.disconnect import unless_disconnected
from gateway.http.encoding import encode
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from protocol.logits import LogitRow, LogitsRequest, LogitsResponse, logit_values
from protocol.wire import LogitRows, Logits


def _floats(raw: bytes, typecode: str) -> array[Any]:
    values = array(typecode, raw)
    if sys.byteorder != "little":  # the wire carries little-endian arrays
        values.byteswap()
    return values


def rows_of(r: LogitRows) -> Iterator[LogitRow]:
    width = r.top_n or r.vocab_size
    logits = _floats(r.logits, "f")
    ids = _floats(r.token_ids, "i") if r.top_n else None
    for i in range(r.n_rows):
        cut = slice(i * width, (i + 1) * width)
        yield LogitRow(logits=logits[cut].tolist(), token_ids=ids[cut].tolist() if ids is not None else None)


def answer_json(model: str, r: LogitRows) -> bytes:
    """The LogitsResponse as JSON, one row at a time: an answer may hold millions of values, and
    converting them in one call would hold the GIL (and so the event loop) for its whole length."""
    head = encode(LogitsResponse(model=model, n_rows=r.n_rows, vocab_size=r.vocab_size, top_n=r.top_n, rows=[]))
    before, after = head.split(b'"rows":[]', 1)
    rows = b",".join(encode(row) for row in rows_of(r))
    return before + b'"rows":[' + rows + b"]" + after


@post("/v1/logits", status_code=200)
async def logits(request: Request, body: RawBody, services: NamedDependency[Services]) -> Response[bytes]:
    data = read_json(body, LogitsRequest)
    entry = services.model_for(data.model, "logits")
    if not data.input_ids:
        raise BadRequest("`input_ids`: at least one token id is required")
    if data.top_n and (too_many := logit_values(1 if data.last_only else len(data.input_ids), data.top_n)):
        raise BadRequest(too_many)  # a whole-vocabulary answer is the worker's to check: it knows the width
    accounting = services.accounting(entry.id, caller_of(request), None)
    worker = await accounting.guard(services.worker(entry, nctx=data.nctx, compute=data.compute, ngl=data.ngl))
    structlog.contextvars.bind_contextvars(input_tokens=len(data.input_ids))
    message = Logits(0, current_request_id() or "", data.input_ids, data.last_only, data.top_n)
    reply = await accounting.guard(unless_disconnected(request, worker.call(message)))
    assert isinstance(reply, LogitRows)
    accounting.settle("ok", len(data.input_ids), 0)
    # Off the event loop: other requests' streams go on while a large answer is converted.
    return Response(await asyncio.to_thread(answer_json, entry.id, reply), media_type="application/json")


handlers = [logits]
