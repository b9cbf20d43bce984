"""`truncation: "auto"` in the chat engine: a conversation whose prompt does not leave room for the
answer loses its oldest droppable groups of messages (protocol/overflow.py's policy) until it
does. Every candidate is rendered by the model's own template and tokenized, so the prompt is
measured in the tokens it will take, and the one that fits is the one the request runs with: one
tokenization per candidate, about log2(groups) of them, and no round trip to the gateway."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import structlog

from protocol import overflow
from protocol.limits import MAX_PROMPT_CHARS_PER_TOKEN
from protocol.wire import FromWorker, Generate, ImageInput, Started
from workers.engines import Emit
from workers.engines.llama.media import MediaPrompt

log = structlog.get_logger("worker.llama")

# A candidate prompt: its keys (token ids, images as negative keys), whether it opened a reasoning
# block, and its images' mtmd chunks (None without images).
Prompt = tuple[list[int], bool, MediaPrompt | None]
# Renders and tokenizes a list of messages with the images they hold.
Tokenizer = Callable[[list[dict[str, Any]], list[ImageInput]], Prompt]


class Dropped(msgspec.Struct, frozen=True):
    messages: int
    tokens: int


def truncate(req: Generate, full: Prompt, nctx: int, tokenize: Tokenizer) -> tuple[Prompt, Dropped | None]:
    """`full` (the whole conversation's prompt, over the budget) or, when groups can go, the prompt
    without the fewest oldest groups that bring it within `overflow.budget`; every group when none
    is enough (the caller then refuses what still does not fit `nctx`). The media of the prompts
    not chosen are freed; on an error, every one but `full`'s (the caller's to free)."""
    messages = req.messages
    assert messages is not None
    limit = overflow.budget(nctx, req.max_tokens)
    drop = overflow.groups([m.get("role") for m in messages])
    if not drop:
        return full, None
    # No token is longer than MAX_PROMPT_CHARS_PER_TOKEN characters: a candidate with more text
    # than that many per token of the budget cannot fit, and is not rendered.
    chars = [overflow.message_chars(m) for m in messages]
    lo = max(1, overflow.least_k(chars, drop, MAX_PROMPT_CHARS_PER_TOKEN * limit))
    starts: list[int] = []  # each message's first image in req.images
    n_images = 0
    for m in messages:
        starts.append(n_images)
        n_images += overflow.image_parts(m) if req.images else 0
    tried: dict[int, Prompt] = {}

    def measure(k: int) -> int:
        keep = overflow.kept(len(messages), drop, k)
        images = [img for i in keep for img in req.images[starts[i] : starts[i] + overflow.image_parts(messages[i])]]
        tried[k] = tokenize([messages[i] for i in keep], images)
        return len(tried[k][0])

    try:
        k = overflow.fit(len(drop), measure, limit, lo)
    except BaseException:
        for _, _, media in tried.values():
            if media is not None:
                media.free()
        raise
    chosen = tried.pop(k)
    for _, _, media in [*tried.values(), full]:
        if media is not None:
            media.free()
    dropped = Dropped(messages=sum(len(g) for g in drop[:k]), tokens=len(full[0]) - len(chosen[0]))
    log.info("context truncated", request_id=req.log_id, dropped_messages=dropped.messages,
             dropped_tokens=dropped.tokens, prompt_tokens=len(chosen[0]), budget=limit, nctx=nctx)  # fmt: skip
    kept_roles = [messages[i].get("role") for i in overflow.kept(len(messages), drop, k)]
    log.debug("context truncated: kept", request_id=req.log_id, roles=",".join(map(str, kept_roles[:200])))
    return chosen, dropped


class Reports:
    """What truncation dropped for each queued request, told the gateway in its Started."""

    def __init__(self) -> None:
        self.pending: dict[int, Dropped] = {}

    def emit(self, emit: Emit) -> Emit:
        """`emit`, adding to a Started the counts of its request's truncation."""
        if not self.pending:
            return emit

        def reporting(msg: FromWorker) -> None:
            if isinstance(msg, Started) and (d := self.pending.pop(msg.req_id, None)) is not None:
                msg = msgspec.structs.replace(msg, dropped_messages=d.messages, dropped_tokens=d.tokens)
            emit(msg)

        return reporting
