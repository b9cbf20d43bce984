"""`geniex pull`: fetch one GGUF variant of a Hugging Face repo into the model store.

huggingface_hub does the talking (HF_ENDPOINT, HF_TOKEN, retries, resume, xet); this module only
chooses the file and makes sure that nothing half-downloaded ever becomes visible in the store.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn

import httpx2
import msgspec
from huggingface_hub import HfApi, constants, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import tqdm as hf_tqdm

from gateway.errors import BadRequest, GenieXError, ModelNotFound
from gateway.models.store import (
    ModelEntry,
    ModelStore,
    parse_name,
    precision_from_filename,
    preference_key,
)

_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


class PullFailed(GenieXError):
    """The hub could not be reached or refused the download."""

    status = 502


class RepoFile(msgspec.Struct, frozen=True):
    name: str  # path inside the repo
    precision: str
    size: int | None
    parts: int  # >1 for split GGUFs (`-00001-of-00003.gguf`)


class _QuietTqdm(hf_tqdm):
    # huggingface_hub's own bar class, forced off: keeps every code path (http, xet) on a real tqdm.
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def pull(store: ModelStore, name: str, *, progress: bool = True) -> ModelEntry:
    """Download `org/repo[:precision]` from the hub into `store` and return its entry."""
    org, repo, wanted = parse_name(name, BadRequest)
    repo_id = f"{org}/{repo}"
    try:
        info = HfApi().model_info(repo_id, files_metadata=True)
    except Exception as exc:  # noqa: BLE001 - every hub failure becomes one clear error (_translate)
        _reraise(exc, repo_id)

    files = gguf_files(
        (s.rfilename, s.size if s.size is not None else s.lfs.size if s.lfs is not None else None)
        for s in (info.siblings or [])
    )
    chosen = choose(repo_id, files, wanted)
    proj = mmproj_file(s.rfilename for s in (info.siblings or []))
    revision = info.sha or "main"
    source = f"hf://{repo_id}/{chosen.name}@{revision}"
    if store.variant_source(org, repo, chosen.precision) == source:
        # Same file at the same commit is already here: re-running pull is cheap.
        return store.resolve(f"{repo_id}:{chosen.precision}")

    staging = store.staging_dir()
    try:
        try:
            local = hf_hub_download(
                repo_id,
                chosen.name,
                revision=revision,
                local_dir=staging,
                tqdm_class=None if progress else _QuietTqdm,
            )
        except Exception as exc:  # noqa: BLE001 - as above
            _reraise(exc, repo_id, chosen.name)
        local_proj = None
        if proj is not None:  # a vision model: its projector comes with it
            try:
                local_proj = hf_hub_download(repo_id, proj, revision=revision, local_dir=staging / "mmproj",
                                             tqdm_class=None if progress else _QuietTqdm)  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - as above
                _reraise(exc, repo_id, proj)
        return store.add_variant(org, repo, chosen.precision, Path(local), source=source,
                                 mmproj=Path(local_proj) if local_proj else None)  # fmt: skip
    finally:
        # Also runs on KeyboardInterrupt: a stopped pull leaves nothing behind.
        shutil.rmtree(staging, ignore_errors=True)


def gguf_files(files: Iterable[tuple[str, int | None]]) -> list[RepoFile]:
    """GGUF model files of a repo listing of (path, size); split files collapse to their first part."""
    out: list[RepoFile] = []
    for path, size in files:
        base = PurePosixPath(path).name
        if not base.lower().endswith(".gguf") or base.lower().startswith("mmproj"):
            continue  # mmproj: vision projectors, not language models
        parts = 1
        if m := _SPLIT_RE.search(base):
            if int(m.group(1)) != 1:
                continue
            parts = int(m.group(2))
        out.append(RepoFile(path, precision_from_filename(base) or "default", size, parts))
    return out


# A repo's projectors, best first: the precision llama.cpp's own conversions publish, then smaller.
MMPROJ_PREFERENCE = ("f16", "bf16", "q8_0", "f32")


def mmproj_file(paths: Iterable[str]) -> str | None:
    """The repo's multimodal projector (mmproj*.gguf) to fetch with its model, or None."""
    found = [p for p in paths if (b := PurePosixPath(p).name.lower()).startswith("mmproj") and b.endswith(".gguf")]

    def rank(path: str) -> tuple[int, str]:
        base = PurePosixPath(path).name.lower()
        hit = [i for i, tag in enumerate(MMPROJ_PREFERENCE) if tag in base]
        return (hit[0] if hit else len(MMPROJ_PREFERENCE), base)

    return min(found, key=rank) if found else None


def choose(repo_id: str, files: list[RepoFile], wanted: str | None) -> RepoFile:
    """The file to download for `wanted` (a precision), or the preferred one when None."""
    if not files:
        raise ModelNotFound(
            f"{repo_id} has no GGUF files; GenieX runs llama.cpp GGUF models (look for a '-GGUF' repository)"
        )
    available = ", ".join(sorted({f.precision for f in files}, key=lambda p: preference_key(p, None)))
    if wanted is None:
        single = [f for f in files if f.parts == 1] or files
        chosen = min(single, key=lambda f: preference_key(f.precision, f.size))
    else:
        matching = [f for f in files if f.precision.casefold() == wanted.casefold()]
        if not matching:
            raise ModelNotFound(f"{repo_id} has no {wanted} GGUF; available precisions: {available}")
        chosen = min(matching, key=lambda f: (f.parts, f.size or 0, f.name))
    if chosen.parts > 1:
        raise ModelNotFound(
            f"{repo_id}:{chosen.precision} is split into {chosen.parts} files, which GenieX does not support; "
            f"available precisions: {available}"
        )
    return chosen


def _reraise(exc: Exception, repo_id: str, filename: str | None = None) -> NoReturn:
    translated = _translate(exc, repo_id, filename)
    if translated is exc:
        raise exc
    raise translated from exc


def _translate(exc: Exception, repo_id: str, filename: str | None) -> Exception:
    """Turn huggingface_hub/httpx errors into one-line messages for `error: ...`."""
    what = f"{repo_id}/{filename}" if filename else repo_id
    if isinstance(exc, GatedRepoError):
        return PullFailed(
            f"{repo_id} is gated: accept its license on Hugging Face, then set HF_TOKEN to a token with access"
        )
    if isinstance(exc, (RepositoryNotFoundError, HFValidationError)):
        return ModelNotFound(f"no model repository {repo_id} on Hugging Face (if it is private, set HF_TOKEN)")
    if isinstance(exc, (RevisionNotFoundError, EntryNotFoundError)) and not isinstance(exc, LocalEntryNotFoundError):
        return ModelNotFound(f"{what} is no longer on Hugging Face; try again")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        return PullFailed(f"download of {what} failed: the hub answered HTTP {status}")
    if isinstance(exc, (httpx2.TransportError, LocalEntryNotFoundError)):
        return PullFailed(
            f"download of {what} failed: cannot reach {constants.ENDPOINT} ({_root_cause(exc)}); "
            "check the network connection, or HF_ENDPOINT if you use a mirror"
        )
    if isinstance(exc, OSError):  # consistency check, disk full, ...
        return PullFailed(f"download of {what} failed: {exc}")
    return exc


def _root_cause(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return str(exc) or type(exc).__name__
