"""Validates a chat request's `spec_*` fields into the worker's `Speculation`.

Everything a client can get wrong is answered here with a 400 naming the field,
before a worker is involved; the one check left to the worker is the draft
model's vocabulary, which needs the model loaded.

`spec_draft_model` names a GGUF the server already has: a pulled catalogue name,
or an absolute path inside the store's `models/` folder or the bundled model's
folder. The path as written and the file it finally resolves to must both lie in
the same allowed folder, so neither `..`, a symlink placed outside pointing in,
nor a symlink inside pointing out can reach other files. The server never downloads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import get_args

from gateway.errors import BadRequest, ModelNotFound
from gateway.models.store import ModelStore, is_gguf
from protocol.chat import ChatRequest
from protocol.wire import DRAFT_MODEL_SPEC_TYPES, SpecType, Speculation

DEFAULT_N_MAX = 3
IMPLEMENTED: tuple[SpecType, ...] = get_args(SpecType)  # what the worker implements: the wire's own list
# The spec's other values, each refused with the reason rather than silently ignored.
REFUSED = {
    "draft-mtp": "needs a model with multi-token-prediction (MTP) heads; the GGUF models this server "
    "runs have none, and its llama.cpp bindings expose no MTP decoding",
    "draft-eagle3": "needs an EAGLE-3 draft head trained for the target model (it reads the target's "
    "hidden states); these GGUF models ship none and this llama.cpp build cannot load one",
    "ngram-map-k4v": "is not supported by this server version; use ngram-map-k",
    "ngram-mod": "is not supported by this server version; use ngram-map-k or ngram-simple",
    "ngram-cache": "is not supported by this server version; use ngram-simple or ngram-map-k",
}


def speculation_of(req: ChatRequest, store: ModelStore) -> Speculation | None:
    kind = req.spec_type
    if not kind:
        return None
    if kind in REFUSED:
        raise BadRequest(f"`spec_type`: {kind!r} {REFUSED[kind]}")
    if kind not in IMPLEMENTED:
        known = ", ".join([*IMPLEMENTED, *REFUSED])
        raise BadRequest(f"`spec_type`: unknown value {kind!r}; expected one of {known} (or empty for none)")
    spec_type: SpecType = kind
    n_max = req.spec_n_max if req.spec_n_max is not None else DEFAULT_N_MAX
    n_min = req.spec_n_min or 0
    if n_min > n_max:
        raise BadRequest(f"`spec_n_min` ({n_min}) must not exceed `spec_n_max` ({n_max})")
    draft_path = ""
    if spec_type in DRAFT_MODEL_SPEC_TYPES:
        if not req.spec_draft_model:
            raise BadRequest(
                f"`spec_draft_model`: required with spec_type {kind!r} (a pulled model name or a GGUF path)"
            )
        draft_path = draft_model_path(req.spec_draft_model, store)
    return Speculation(type=spec_type, n_max=n_max, n_min=n_min, p_min=req.spec_p_min or 0.0, draft_path=draft_path)


def draft_model_path(name: str, store: ModelStore) -> str:
    """The canonical path of the GGUF `name` designates, or BadRequest."""
    if "\x00" in name or len(name) > 4096:
        raise BadRequest("`spec_draft_model`: not a model name or a path")
    if os.path.isabs(name) or name.startswith(("~", "./", "../")):
        return _allowed_path(name, store)
    try:
        return os.path.realpath(store.resolve(name).path)
    except ModelNotFound as exc:
        raise BadRequest(f"`spec_draft_model`: {exc.message}. Draft models must be pulled with "
                         "`geniex pull` first (the server never downloads), or given as an absolute "
                         "path to a GGUF in the model store") from exc  # fmt: skip


def allowed_roots(store: ModelStore) -> list[str]:
    roots = [str(store.models_dir)]
    roots += sorted({str(Path(e.path).parent) for e in store.bundled})
    return roots


def _allowed_path(raw: str, store: ModelStore) -> str:
    if not os.path.isabs(raw):
        raise BadRequest(f"`spec_draft_model`: {raw!r} is neither a model name (org/repo[:precision]) "
                         "nor an absolute path")  # fmt: skip
    given = os.path.normpath(raw)
    real = os.path.realpath(raw)
    for root in allowed_roots(store):
        real_root = os.path.realpath(root)
        if (_inside(given, os.path.normpath(root)) or _inside(given, real_root)) and _inside(real, real_root):
            break
    else:
        raise BadRequest(f"`spec_draft_model`: {raw!r} is outside the folders draft models may be loaded "
                         f"from ({', '.join(allowed_roots(store))}); pull the model with `geniex pull` "
                         "and name it, or give a path inside the model store")  # fmt: skip
    if not os.path.isfile(real):
        raise BadRequest(f"`spec_draft_model`: no file at {raw!r}")
    if not is_gguf(Path(real)):
        raise BadRequest(f"`spec_draft_model`: {raw!r} is not a GGUF file")
    return real


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives, or a mix of absolute and relative
        return False
