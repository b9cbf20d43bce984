"""`geniex pull`: fetch one GGUF variant of a Hugging Face repo into the model store.

huggingface_hub does the talking (HF_ENDPOINT, HF_TOKEN, retries, resume, xet); this module only
chooses the file and makes sure that nothing half-downloaded ever becomes visible in the store.
The server's pulls (gateway/models/pulls.py) run the same function in a thread, following it with
`on_progress` and stopping it with `cancel`.
"""

from __future__ import annotations

import errno
import hashlib
import re
import shutil
import threading
from collections.abc import Callable, Iterable
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
from huggingface_hub.hf_api import RepoSibling
from huggingface_hub.utils import tqdm as hf_tqdm

from gateway.errors import BadRequest, GenieXError, ModelNotFound
from gateway.models.store import (
    ModelEntry,
    ModelStore,
    parse_name,
    precision_from_filename,
    preference_key,
)
from protocol.pull import PullProgress

_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# huggingface_hub reads a download in 10 MiB pieces and reports progress once per piece; the server
# reads 1 MiB ones, so that a progress bar moves and a cancel lands within a MiB even on a slow link.
SERVER_CHUNK = 1 << 20
_HASH_BLOCK = 8 << 20

ProgressFn = Callable[[PullProgress], None]


class PullFailed(GenieXError):
    """The hub could not be reached or refused the download."""

    status = 502


class DiskFull(GenieXError):
    """The data dir's disk cannot hold the download (507 Insufficient Storage)."""

    status = 507


class PullCancelled(GenieXError):
    """The pull was stopped: every client following it went away, or the server is shutting down."""

    status = 499  # nginx's "client closed request": nobody reads it, the log does


class RepoFile(msgspec.Struct, frozen=True):
    name: str  # path inside the repo
    precision: str
    size: int | None
    parts: int  # >1 for split GGUFs (`-00001-of-00003.gguf`)


class Fetch(msgspec.Struct, frozen=True):
    """One file to download, as the hub lists it."""

    name: str
    digest: str  # "sha256:<hex>", the hub's LFS hash; "" when it gives none
    size: int | None


def _ignore(_: PullProgress) -> None:
    pass


def finer_chunks() -> None:
    """Read downloads in SERVER_CHUNK pieces from now on, in this process (the server's)."""
    constants.DOWNLOAD_CHUNK_SIZE = min(constants.DOWNLOAD_CHUNK_SIZE, SERVER_CHUNK)


def pull(store: ModelStore, name: str, *, progress: bool = True, on_progress: ProgressFn | None = None,
         cancel: threading.Event | None = None) -> ModelEntry:  # fmt: skip
    """Download `org/repo[:precision]` from the hub into `store` and return its entry.

    `progress`: huggingface_hub's progress bar on stderr (the CLI). `on_progress` is called, in this
    thread, with each step: the manifest, every file's bytes (first 0, last its size), the digest
    check, the move into the store, success. Setting `cancel` stops the pull within a read of the
    download (PullCancelled), leaving nothing behind."""
    report = on_progress or _ignore

    def check() -> None:
        if cancel is not None and cancel.is_set():
            raise PullCancelled(f"the pull of {name} was cancelled")

    org, repo, wanted = parse_name(name, BadRequest)
    repo_id = f"{org}/{repo}"
    report(PullProgress("manifest"))
    try:
        info = HfApi().model_info(repo_id, files_metadata=True)
    except Exception as exc:  # noqa: BLE001 - every hub failure becomes one clear error (_translate)
        _reraise(exc, repo_id)
    check()

    siblings = {s.rfilename: s for s in info.siblings or []}
    files = gguf_files((s.rfilename, _size(s)) for s in siblings.values())
    chosen = choose(repo_id, files, wanted)
    proj = mmproj_file(siblings)
    fetches = [_fetch(siblings[chosen.name])] + ([_fetch(siblings[proj])] if proj is not None else [])
    revision = info.sha or "main"
    source = f"hf://{repo_id}/{chosen.name}@{revision}"
    if store.variant_source(org, repo, chosen.precision) == source:
        # Same file at the same commit is already here: re-running pull is cheap.
        for f in fetches:
            report(PullProgress("downloading", f.name, f.digest, f.size or 0, f.size or 0))
        report(PullProgress("success"))
        return store.resolve(f"{repo_id}:{chosen.precision}")

    staging = store.staging_dir()
    try:
        _check_space(staging, fetches, f"{repo_id}:{chosen.precision}")
        local: list[Path] = []
        # A vision model's projector comes with it, in a folder of its own (both may have one name).
        for f, folder in zip(fetches, (staging, staging / "mmproj")):
            check()
            report(PullProgress("downloading", f.name, f.digest, f.size or 0, 0))
            try:
                got = hf_hub_download(repo_id, f.name, revision=revision, local_dir=folder,
                                       tqdm_class=_bar_class(f, report, check, quiet=not progress))  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - as above
                _reraise(exc, repo_id, f.name)
            local.append(Path(got))
            size = local[-1].stat().st_size
            report(PullProgress("downloading", f.name, f.digest, size, size))
        check()
        report(PullProgress("verifying"))
        for f, file in zip(fetches, local):
            verify(file, f, repo_id, check)
        check()
        report(PullProgress("writing"))
        try:
            entry = store.add_variant(org, repo, chosen.precision, local[0], source=source,
                                      mmproj=local[1] if len(local) > 1 else None)  # fmt: skip
        except OSError as exc:
            _reraise(exc, repo_id, chosen.name)
        report(PullProgress("success"))
        return entry
    finally:
        # Also runs on KeyboardInterrupt and on a cancel: a stopped pull leaves nothing behind.
        shutil.rmtree(staging, ignore_errors=True)


def _size(s: RepoSibling) -> int | None:
    return s.size if s.size is not None else s.lfs.size if s.lfs is not None else None


def _fetch(s: RepoSibling) -> Fetch:
    sha = s.lfs.sha256 if s.lfs is not None else ""
    return Fetch(s.rfilename, f"sha256:{sha}" if sha else "", _size(s))


def _check_space(staging: Path, fetches: list[Fetch], what: str) -> None:
    """Refuse before the first byte what cannot fit (huggingface_hub only warns, then fails mid-file)."""
    need = sum(f.size or 0 for f in fetches)
    free = shutil.disk_usage(staging).free
    if need > free:
        raise DiskFull(f"not enough disk space to pull {what}: it needs {_gb(need)}, the data dir "
                       f"({staging.parents[1]}) has {_gb(free)} free")  # fmt: skip


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 10_000_000 else f"{n / 1e6:.2f} MB"


def _bar_class(f: Fetch, report: ProgressFn, check: Callable[[], None], *, quiet: bool) -> type[hf_tqdm]:
    """The progress bar huggingface_hub makes for the download (both the http and the xet paths call
    it): it reports the bytes written so far and raises PullCancelled once `check` says so."""

    class Bar(hf_tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if quiet:
                kwargs["disable"] = True  # still a real tqdm, so that every code path finds what it calls
            super().__init__(*args, **kwargs)
            self.written = int(kwargs.get("initial") or 0)  # tqdm's own count stops while it is disabled

        def update(self, n: float | None = 1) -> bool | None:
            check()
            self.written += int(n or 0)
            total = f.size or int(self.total or 0)
            report(PullProgress("downloading", f.name, f.digest, total, max(0, min(self.written, total))))
            return super().update(n)

        # With these, xet routes its network bytes here too instead of making a second bar.
        def update_transfer(self, n: float | None = 1) -> None:
            check()

        def set_transfer_postfix_str(self, s: str = "", refresh: bool = True) -> None:
            pass

    return Bar


def verify(path: Path, f: Fetch, repo_id: str, check: Callable[[], None]) -> None:
    """The file's sha256 is the hub's (huggingface_hub checks only the size of an http download)."""
    if not f.digest:
        return
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            check()
            h.update(block)
    want = f.digest.removeprefix("sha256:")
    if h.hexdigest() != want:
        raise PullFailed(f"download of {repo_id}/{f.name} arrived damaged: its sha256 is {h.hexdigest()[:12]}…, "
                         f"the hub's is {want[:12]}…; pull again")  # fmt: skip


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
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"download of {what} failed: the data dir's disk is full ({exc.strerror}); "
                        "free some space and pull again")  # fmt: skip
    if isinstance(exc, OSError):  # consistency check, ...
        return PullFailed(f"download of {what} failed: {exc}")
    return exc


def _root_cause(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return str(exc) or type(exc).__name__
