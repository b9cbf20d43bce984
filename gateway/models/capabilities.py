"""What a model can be asked for: its engine's row of protocol/engines.py, or an upstream model's
descriptor; the routes that serve it, as /v1/models lists them."""

from __future__ import annotations

import functools
import os

from protocol import engines, upstream


def capabilities_of(engine: str, path: str = "") -> list[str]:
    """What a model of `engine` can do (protocol/engines.py); an upstream model (its descriptor at
    `path`) says itself."""
    row = engines.info(engine)
    if row.remote:
        try:
            return list(_upstream_capabilities(path, os.path.getmtime(path)))
        except OSError:
            return []
    return list(row.capabilities)


@functools.lru_cache(maxsize=256)
def _upstream_capabilities(path: str, mtime: float) -> tuple[str, ...]:
    """Read once per version of the descriptor (a request checks it before its worker starts)."""
    try:
        with open(path, "rb") as f:
            return tuple(upstream.decode(f.read(1 << 20)).capabilities)
    except (OSError, upstream.UpstreamError):
        return ()


def serving(engines_of: dict[str, str], capability: str, paths: dict[str, str] | None = None) -> list[str]:
    """The model ids (of `engines_of`: id -> engine; `paths`: id -> model path) that have `capability`, sorted."""
    paths = paths or {}
    return sorted(m for m, e in engines_of.items() if capability in capabilities_of(e, paths.get(m, "")))


def entry_capabilities(engine: str, path: str, mmproj: str) -> list[str]:
    """An installed model's capabilities: its engine's, and `vision` for a chat model with a projector."""
    caps = capabilities_of(engine, path)
    return [*caps, "vision"] if mmproj and "chat" in caps else caps
