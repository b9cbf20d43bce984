"""A Genie bundle: an LLM exported by Qualcomm AI Hub for Genie (the Qualcomm AI Runtime's LLM
library, libGenie), checked before anything loads it (`geniex pull --local`, the qairt worker).

    BUNDLE/genie_config.json            {"dialog": {...}}: context, sampler, tokenizer, engine
    BUNDLE/tokenizer.json               the tokenizer Genie reads (`dialog.tokenizer.path`)
    BUNDLE/*.bin                        QNN context binaries, the weights (`dialog.engine.model.binary.ctx-bins`)
    BUNDLE/htp_backend_ext_config.json  the HTP backend's settings (`dialog.engine.backend.extensions`), if named
    BUNDLE/tokenizer_config.json        the chat template (optional; Genie does not read it, the worker does)

The config is data from elsewhere, read by a native library that opens whatever paths it names, so
every file it names must be a relative path that resolves (after symlinks) to a file inside the
bundle folder; no string anywhere in it may be an absolute path or climb out with `..`. Genie
resolves relative paths against the process's working directory, not the config's folder: the
worker hands it `loadable_config`'s copy, every named file made absolute.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec

CONFIG_FILE = "genie_config.json"
# Files a bundle may carry beside those its config names: the chat template the worker renders.
EXTRAS = ("tokenizer_config.json", "chat_template.jinja")
# A real config is a few KiB; a bound keeps a hostile one from being read whole.
MAX_CONFIG_BYTES = 4 << 20
_PRECISION_RE = re.compile(r"(?<![A-Za-z0-9])(w\d+a\d+)(?![A-Za-z0-9])", re.IGNORECASE)


class BundleError(ValueError):
    """A bundle that cannot be used as it is; the message names the file, the field and the reason."""


class GenieBundle(msgspec.Struct, frozen=True, kw_only=True):
    folder: str  # the bundle folder, absolute
    config: str  # its genie_config.json, absolute
    tokenizer: str  # as the config names it, relative to the folder
    ctx_bins: tuple[str, ...]  # likewise, in the config's order (all engines')
    extensions: str = ""  # the backend extensions config, "" when none is named
    extras: tuple[str, ...] = ()  # EXTRAS the folder has
    backend: str = ""  # dialog.engine.backend.type, e.g. "QnnHtp"
    context_size: int = 0  # dialog.context.size; 0 when the config does not say
    total_bytes: int  # the config, every file it names and the extras

    @property
    def files(self) -> tuple[str, ...]:
        """Every file of the bundle, relative to its folder, each once: what an import copies."""
        names = (CONFIG_FILE, self.tokenizer, *self.ctx_bins, *((self.extensions,) if self.extensions else ()),
                 *self.extras)  # fmt: skip
        return tuple(dict.fromkeys(names))


def is_bundle(folder: Path) -> bool:
    """`folder` holds a Genie config (a dangling link counts: read_bundle then says what is wrong)."""
    return os.path.lexists(folder / CONFIG_FILE)


def precision_of(folder: Path) -> str | None:
    """The quantization AI Hub writes in a bundle's folder name (`...-genie-w4a16-...`), or None."""
    m = _PRECISION_RE.search(folder.name)
    return m.group(1).lower() if m else None


def read_bundle(folder: Path) -> GenieBundle:
    """The bundle in `folder`, every file its config names checked; BundleError naming what is wrong."""
    return _read(Path(folder))[1]


def loadable_config(folder: Path) -> bytes:
    """The bundle's config as JSON for GenieDialogConfig_createFromJson, checked as read_bundle
    checks it, with every file it names made absolute (Genie would resolve them against the
    working directory)."""
    folder = Path(folder)
    config, _ = _read(folder)
    root = folder.resolve()
    for _field, parent, key, name in _named_files(config["dialog"]):
        parent[key] = str(root / _plain(name))
    return msgspec.json.encode(config)


def _read(folder: Path) -> tuple[dict[str, Any], GenieBundle]:
    path = folder / CONFIG_FILE
    if not folder.is_dir():
        raise BundleError(f"{folder}: not a folder")
    raw = _read_config(folder, path)
    try:
        config = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise BundleError(f"{path}: not JSON ({_line(str(exc))})") from None
    if not isinstance(config, dict):
        raise BundleError(f"{path}: expected a JSON object, found {type(config).__name__}")
    dialog = config.get("dialog")
    if not isinstance(dialog, dict):
        raise BundleError(f"{path}: dialog: missing, or not an object (a Genie dialog config has one)")
    for field, value in _strings(dialog, "dialog"):
        if _escapes(value):
            raise BundleError(f"{path}: {field}: {value[:200]!r} is not a relative path inside the bundle")
    tokenizer = ""
    bins: list[str] = []
    extensions = ""
    sizes = {CONFIG_FILE: len(raw)}  # by name: a file two engines share counts once
    for field, _parent, _key, name in _named_files(dialog, path):
        sizes[_plain(name)] = _inside(folder, path, field, name)
        if field == "dialog.tokenizer.path":
            tokenizer = name
        elif ".ctx-bins[" in field:
            bins.append(name)
        elif field.endswith(".backend.extensions"):
            extensions = extensions or name
    extras = []
    for extra in EXTRAS:
        if os.path.lexists(folder / extra):
            sizes[extra] = _inside(folder, path, f"the extra file {extra}", extra)
            extras.append(extra)
    engine = dialog["engine"][0] if isinstance(dialog["engine"], list) else dialog["engine"]
    backend = engine.get("backend")
    context = dialog.get("context")
    size = context.get("size") if isinstance(context, dict) else None
    bundle = GenieBundle(
        folder=str(folder.absolute()),
        config=str(path.absolute()),
        tokenizer=_plain(tokenizer),
        ctx_bins=tuple(_plain(b) for b in bins),
        extensions=_plain(extensions) if extensions else "",
        extras=tuple(extras),
        backend=str(backend.get("type") or "") if isinstance(backend, dict) else "",
        context_size=size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0,
        total_bytes=sum(sizes.values()),
    )
    return config, bundle


def _read_config(folder: Path, path: Path) -> bytes:
    """The config's bytes, refused unread when it is no regular file inside the folder or too large."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise BundleError(f"{path}: missing (a Genie bundle's config)") from None
    except OSError as exc:
        raise BundleError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):  # a FIFO or a device would block or never end
        raise BundleError(f"{path}: not a regular file")
    if not path.resolve().is_relative_to(folder.resolve()):
        raise BundleError(f"{path}: links outside the bundle folder")
    if info.st_size > MAX_CONFIG_BYTES:
        raise BundleError(f"{path}: {info.st_size} bytes, more than a Genie config's {MAX_CONFIG_BYTES >> 20} MiB")
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise BundleError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_CONFIG_BYTES:  # grew since the stat
        raise BundleError(f"{path}: more than a Genie config's {MAX_CONFIG_BYTES >> 20} MiB")
    return raw


def _named_files(dialog: dict[str, Any], config: Path | None = None) -> Iterator[tuple[str, Any, Any, str]]:
    """(field, the container holding the name, its key or index, the name) for each file the dialog
    names. With `config` (the file, for the message) a required field that is missing or malformed
    raises BundleError; without, it is passed over."""

    def missing(field: str, why: str) -> None:
        if config is not None:
            raise BundleError(f"{config}: {field}: {why}")

    tokenizer = dialog.get("tokenizer")
    name = tokenizer.get("path") if isinstance(tokenizer, dict) else None
    if isinstance(name, str) and name:
        yield "dialog.tokenizer.path", tokenizer, "path", name
    else:
        missing("dialog.tokenizer.path", "missing, or not a file name")
    engine = dialog.get("engine")
    engines = engine if isinstance(engine, list) and engine else [engine]
    for i, e in enumerate(engines):
        at = f"dialog.engine[{i}]" if isinstance(engine, list) else "dialog.engine"
        if not isinstance(e, dict):
            missing(at, "missing, or not an object")
            continue
        backend = e.get("backend")
        if isinstance(backend, dict) and "extensions" in backend:
            ext = backend["extensions"]
            if isinstance(ext, str) and ext:
                yield f"{at}.backend.extensions", backend, "extensions", ext
            else:
                missing(f"{at}.backend.extensions", "not a file name")
        model = e.get("model")
        if not isinstance(model, dict):
            missing(f"{at}.model", "missing, or not an object")
            continue
        if model.get("type", "binary") != "binary":
            missing(f"{at}.model.type", f'{model.get("type")!r}: only QNN context binaries ("binary") are served')
        binary = model.get("binary")
        bins = binary.get("ctx-bins") if isinstance(binary, dict) else None
        if not isinstance(bins, list) or not bins or not all(isinstance(b, str) and b for b in bins):
            missing(f"{at}.model.binary.ctx-bins", "missing, empty, or not a list of file names")
            continue
        for j, b in enumerate(bins):
            yield f"{at}.model.binary.ctx-bins[{j}]", bins, j, b
    embedding = dialog.get("embedding")  # dialogs fed embeddings (vision language models) read a table
    lut = embedding.get("lut-path") if isinstance(embedding, dict) else None
    if isinstance(lut, str) and lut:
        yield "dialog.embedding.lut-path", embedding, "lut-path", lut


def _inside(folder: Path, config: Path, field: str, name: str) -> int:
    """The size of the file `name` names, refused unless it is a file inside `folder`."""
    if _escapes(name) or not name.strip():
        raise BundleError(f"{config}: {field}: {name[:200]!r} is not a relative path inside the bundle")
    target = folder / _plain(name)
    try:
        resolved = target.resolve(strict=True)
    except (OSError, RuntimeError):
        raise BundleError(f"{config}: {field}: {name!r} does not exist in the bundle ({target})") from None
    if not resolved.is_relative_to(folder.resolve()):
        raise BundleError(f"{config}: {field}: {name!r} links outside the bundle folder (to {resolved})")
    if not resolved.is_file():
        raise BundleError(f"{config}: {field}: {name!r} is not a file")
    return resolved.stat().st_size


def _plain(name: str) -> str:
    """A relative name as the bundle's own path (`./tokenizer.json` -> `tokenizer.json`)."""
    return str(PurePosixPath(*PurePosixPath(name.replace("\\", "/")).parts))


def _escapes(value: str) -> bool:
    """An absolute path (POSIX, UNC or with a drive letter) or one that climbs with `..`; NUL too."""
    v = value.replace("\\", "/")
    return v.startswith("/") or bool(re.match(r"[A-Za-z]:(/|$)", v)) or ".." in v.split("/") or "\0" in v


def _strings(value: Any, field: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield field, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{field}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{field}[{i}]")


def _line(text: str) -> str:
    return " ".join(text.split())[:300]
