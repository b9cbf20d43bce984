"""Pulling a model over HTTP: `POST /v1/models/pull` (SSE) and Ollama's `POST /api/pull` (NDJSON).

`PullProgress` is what the download itself reports, step by step; the routes render it in their own
wire shape, `PullStatus` (`{"status", "digest", "total", "completed"}`, Ollama's progress object,
which the SSE `progress` event reuses).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

# Long enough for any Hugging Face `org/repo:QUANT` (96 + 96 characters at most), short enough
# that a hostile name is refused by the decoder before anything looks at it.
Name = Annotated[str, Meta(max_length=512)]

# manifest: asking the hub what the repo holds; downloading: one file's bytes; verifying: the
# sha256 of what arrived against the hub's; writing: moving it into the store; success: listed.
Phase = Literal["manifest", "downloading", "verifying", "writing", "success"]


class PullProgress(msgspec.Struct, frozen=True):
    """One step of a pull, as `gateway.models.pull.pull` reports it to its `on_progress`."""

    phase: Phase
    file: str = ""  # the file's path in the repo, while downloading
    digest: str = ""  # "sha256:<hex>": the hub's LFS hash of the file ("" when the hub gives none)
    total: int = 0  # bytes
    completed: int = 0

    @property
    def final(self) -> bool:
        """A step a follower must see: every phase change, and a file's first and last byte counts."""
        return self.phase != "downloading" or self.completed in (0, self.total)


class PullRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/models/pull`."""

    model: Name  # org/repo[:precision], or Ollama's hf.co/org/repo:QUANT
    stream: bool = True


class OllamaPullRequest(msgspec.Struct, kw_only=True):
    """`POST /api/pull` as Ollama's clients send it; unknown fields (`username`, ...) are ignored."""

    model: Name | None = None
    name: Name | None = None  # what older clients send instead of `model`
    insecure: bool = False  # Ollama's "allow a registry without TLS": the hub is always HTTPS, so ignored
    stream: bool = True

    @property
    def which(self) -> str:
        return self.model or self.name or ""


class PullStatus(msgspec.Struct, omit_defaults=True):
    """A progress line of Ollama's `/api/pull`, and the `progress` event of `/v1/models/pull`."""

    status: str  # "pulling manifest", "pulling <12 hex>", "verifying sha256 digest", "writing manifest", "success"
    digest: str | None = None
    total: int | None = None
    completed: int | None = None
    file: str | None = None  # the file's path in the repo (`/v1/models/pull` only: Ollama has none)


class PullError(msgspec.Struct):
    """The `error` event of `/v1/models/pull`, and the last line of a failed `/api/pull` stream."""

    error: str


def status_of(p: PullProgress, *, with_file: bool = False) -> PullStatus:
    """`p` as Ollama words it."""
    file = (p.file or None) if with_file else None
    if p.phase == "manifest":
        return PullStatus("pulling manifest")
    if p.phase == "downloading":
        # Ollama names a layer by its digest's first 12 hex digits; a file the hub gives no LFS hash
        # for (never a GGUF on Hugging Face) goes by its name.
        label = p.digest.removeprefix("sha256:")[:12] if p.digest else p.file
        return PullStatus(f"pulling {label}", p.digest or None, p.total, p.completed, file)
    if p.phase == "verifying":
        return PullStatus("verifying sha256 digest")
    if p.phase == "writing":
        return PullStatus("writing manifest")
    return PullStatus("success")
