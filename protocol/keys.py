"""The identity of a worker: one process per (model, compute unit, nctx, ngl)."""

from __future__ import annotations

import hashlib
import re

import msgspec


class WorkerKey(msgspec.Struct, frozen=True, order=True):
    model: str
    compute: str
    nctx: int
    ngl: int = 0

    @property
    def slug(self) -> str:
        """A short, filesystem- and label-safe name: ipc path, logger name, metric label."""
        base = re.sub(r"[^A-Za-z0-9._-]+", "-", self.model.split("/")[-1])[:40]
        digest = hashlib.blake2s(msgspec.msgpack.encode(self), digest_size=4).hexdigest()
        return f"{base}.{self.compute}.{self.nctx}.{digest}"
