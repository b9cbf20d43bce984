"""`/v1/models`, `/v1/models/{model}`, and the explicit lifecycle: `/v1/models/load` and `/unload`."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from protocol.chat import Compute
from protocol.limits import Count, KeepAlive


class Resident(msgspec.Struct):
    """One worker serving the model now (a model may have several: per compute unit and nctx)."""

    compute: str
    nctx: int
    state: str  # starting, ready (idle or busy), stopping
    pid: int | None
    keep_alive: float  # seconds it stays after its last request; negative: until evicted or unloaded
    runs_on: str | None = None  # the unit it really runs on (None until it is ready)
    devices: list[str] = []  # the GPU/NPU devices it offloads layers to, e.g. ["Vulkan0"]
    offloaded_layers: int | None = None  # of `n_layers` (llama.cpp's count: the layers and the output)
    n_layers: int | None = None


class Model(msgspec.Struct, omit_defaults=True):
    id: str
    created: int
    owned_by: str
    object: str  # always "model": no default, so that it is never omitted
    # What a client needs to choose a model (None where the file does not say). No defaults
    # either: an empty `loaded` is news ("not loaded"), not noise to omit.
    capabilities: list[str]  # chat, completion, tools, logits, embeddings, rerank
    loaded: list[Resident]
    # The same, as the booleans clients (editors' model pickers) read, and where and how it runs.
    tools: Annotated[bool, Meta(description="chat requests may carry `tools`; its answers may call them")]
    vision: Annotated[bool, Meta(description="chat messages may carry images (the model has a vision projector)")]
    reasoning: Annotated[
        bool | None,
        Meta(
            description="its chat template has a thinking (`<think>`) block, which `enable_think` turns on or off; "
            "null where the gateway cannot tell before the model loads (not a GGUF)"
        ),
    ]
    embeddings: Annotated[bool, Meta(description="served by /v1/embeddings")]
    audio: Annotated[bool, Meta(description="an audio model: /v1/audio/transcriptions or /v1/audio/speech")]
    served_context: Annotated[
        int | None,
        Meta(
            description="the context, in tokens, a request without `nctx` gets: the model's default or the "
            "server's --nctx, at most `context_length`; null for a model with no context"
        ),
    ]
    compute: Annotated[
        str,
        Meta(
            description="the unit a request without `compute` runs on: the server's default resolved for this "
            "model's engine on this host (cpu, gpu, npu, hybrid; remote: served elsewhere)"
        ),
    ]
    state: Annotated[
        str,
        Meta(
            description="its workers in one word: not_loaded, loading, ready, busy, stopping, or failed (its last "
            "worker crashed, or it is refused for crashing too often)"
        ),
    ]
    aliases: Annotated[list[str], Meta(description="other names requests may use for it")]
    defaults: Annotated[
        dict[str, Any], Meta(description="settings applied to its requests when they do not set them (the models file)")
    ]
    context_length: int | None = None  # the context the model was trained for
    quantization: str | None = None
    engine: str | None = None
    size: int | None = None  # bytes on disk
    permission: list[dict[str, Any]] = []
    defaults_source: Annotated[
        str | None, Meta(description="where `defaults` and `aliases` come from (a file and its table); absent: none")
    ] = None


class ModelList(msgspec.Struct):
    data: list[Model]
    object: str = "list"


class LoadRequest(msgspec.Struct, kw_only=True):
    model: Annotated[str, Meta(max_length=512)]
    nctx: Count | None = None  # 0 or absent: the server's --nctx
    compute: Compute | None = None
    keep_alive: KeepAlive | None = None  # -1: never stopped for idleness (eviction may still make room)


class UnloadRequest(msgspec.Struct, kw_only=True):
    model: Annotated[str, Meta(max_length=512)]
    nctx: Count | None = None  # with compute: only that worker; absent: every worker of the model
    compute: Compute | None = None


class Unloaded(msgspec.Struct):
    model: str
    unloaded: list[Resident]  # what was stopped by this call (empty: nothing was loaded)
    object: str = "model.unload"
