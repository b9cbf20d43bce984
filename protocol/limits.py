"""Bounds on the integers a request may carry to a worker.

A JSON integer has no size, but msgpack carries at most 64 bits and llama.cpp takes context
sizes, token counts, top-k, layer counts and token ids as 32-bit C integers (ctypes wraps a
larger value silently). Checked at decoding, an out-of-range value is a 400 naming the field
instead of an OverflowError (a 500) on the way to the worker, or a wrapped number inside it.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

INT32_MAX = 2**31 - 1

Int32 = Annotated[int, Meta(ge=-(2**31), le=INT32_MAX)]
Count = Annotated[int, Meta(ge=0, le=INT32_MAX)]  # zero allowed: "no limit" or "none" where a field says so
PositiveInt = Annotated[int, Meta(ge=1, le=INT32_MAX)]
# Out-of-vocabulary ids are the worker's to refuse, with the vocabulary size in the message.
TokenId = Int32
