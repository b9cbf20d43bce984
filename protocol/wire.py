"""Messages between the gateway and a worker: two tagged unions, msgpack-encoded.

Gateway -> worker: Generate, Cancel, Ping, Shutdown.
Worker -> gateway: Ready, Delta, Done, Failed, Pong, Dying.

Hot-path structs are `array_like` (no field names on the wire) and `gc=False`.
No pickle crosses the boundary: decoders are typed, so anything else is refused.
"""

from __future__ import annotations

from typing import Any

import msgspec

PROTOCOL_VERSION = 1


class Sampling(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """Sampler settings for one sequence; `temperature == 0` means greedy."""

    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None


class Speculation(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """Speculative decoding for one request, validated by the gateway.

    `type` is one the worker implements (ngram-simple, ngram-map-k, draft-simple);
    `n_min`/`p_min` of 0 mean "no lower bound"; `draft_path` is the canonical path
    of the draft GGUF for draft-* types (already checked to lie in an allowed folder).
    """

    type: str
    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0
    draft_path: str = ""


class Generate(msgspec.Struct, tag="generate", array_like=True, omit_defaults=True):
    """One generation request. Exactly one of `messages` (chat) or `prompt` (raw text) is set."""

    req_id: int
    log_id: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    template_vars: dict[str, Any] = {}
    max_tokens: int | None = None
    stop: list[str] = []
    sampling: Sampling = Sampling()
    keep_cache: bool = False
    speculation: Speculation | None = None  # last: array_like, so older encoders stay valid


class Warmup(msgspec.Struct, tag="warmup", array_like=True):
    """Nothing to generate: answered with Done once the engine is loaded."""

    req_id: int


class Cancel(msgspec.Struct, tag="cancel", array_like=True):
    req_id: int


class Ping(msgspec.Struct, tag="ping", array_like=True):
    nonce: int = 0


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    pass


class SetThreads(msgspec.Struct, tag="threads", array_like=True):
    """How many threads to decode with from now on: the gateway shares the cores
    between busy CPU workers, because spinning thread pools that outnumber the
    cores stall each other to a crawl."""

    n: int


ToWorker = Generate | Warmup | Cancel | Ping | Shutdown | SetThreads


class Ready(msgspec.Struct, tag="ready", array_like=True, omit_defaults=True):
    """The worker's first message: it has loaded its engine and can serve."""

    protocol_version: int
    pid: int
    engine: str
    compute: str
    n_ctx: int
    n_ctx_train: int = 0
    n_vocab: int = 0
    parallel: int = 1
    model_bytes: int = 0
    load_seconds: float = 0.0
    chat_template: bool = False
    description: str = ""


class Delta(msgspec.Struct, tag="delta", array_like=True, gc=False):
    """Text produced since the last Delta of this request, and how many tokens it took."""

    req_id: int
    text: str
    n_tokens: int


class Done(msgspec.Struct, tag="done", array_like=True, gc=False, omit_defaults=True):
    req_id: int
    finish_reason: str  # "stop" | "length" | "cancelled"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # Draft tokens the target model confirmed / refused (speculative requests only).
    accepted_tokens: int = 0
    rejected_tokens: int = 0


class Failed(msgspec.Struct, tag="failed", array_like=True, omit_defaults=True):
    """A request the worker could not serve; `status` is the HTTP status it deserves."""

    req_id: int
    status: int
    message: str
    code: str | None = None


class Pong(msgspec.Struct, tag="pong", array_like=True):
    nonce: int
    active: int
    waiting: int
    tokens_generated: int


class Dying(msgspec.Struct, tag="dying", array_like=True):
    """Sent from the worker's top-level handler so the gateway can name the root cause."""

    message: str


FromWorker = Ready | Delta | Done | Failed | Pong | Dying


class Codec:
    """One encoder and one typed decoder for one direction."""

    def __init__(self, decode_type: Any) -> None:
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(decode_type)
        self.encode = self._enc.encode
        self.decode = self._dec.decode


def gateway_codec() -> Codec:
    """Encodes ToWorker (any struct), decodes FromWorker."""
    return Codec(FromWorker)


def worker_codec() -> Codec:
    """Encodes FromWorker, decodes ToWorker."""
    return Codec(ToWorker)
