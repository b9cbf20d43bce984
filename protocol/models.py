"""`/v1/models` and `/v1/models/{model}`."""

from __future__ import annotations

from typing import Any

import msgspec


class Model(msgspec.Struct, omit_defaults=True):
    id: str
    created: int
    owned_by: str
    object: str = "model"
    permission: list[dict[str, Any]] = []
    engine: str | None = None
    size: int | None = None


class ModelList(msgspec.Struct):
    data: list[Model]
    object: str = "list"
