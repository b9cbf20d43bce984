"""The NPU chat engine's converted graphs in the data dir (`<data-dir>/npu/<stem>-<key>/`), as both
sides see them: the worker writes a folder per version of a GGUF, with `npu.json` naming the GGUF
it came from (`source`); the gateway's `geniex rm` and the worker's next conversion remove the
folders no model needs any more (each holds the 4-bit graphs and their QNN context binaries)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

NPU_DIR = "npu"
CONFIG_FILE = "npu.json"
# The graphs' layout (workers/engines/npu/convert.py): a new version converts every model again,
# and a bundle made by another version is refused (protocol/npu_bundle.py).
CONVERTER_VERSION = 3


def cache_key(gguf_path: str) -> str:
    """Names a converted folder: the GGUF's resolved path, size and mtime, and this converter's
    version (hashing the file itself would read hundreds of MB on every load)."""
    p = Path(gguf_path).resolve()
    st = p.stat()
    digest = hashlib.sha256(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0{CONVERTER_VERSION}".encode()).hexdigest()
    return f"{p.stem}-{digest[:16]}"


def source_of(folder: Path) -> str | None:
    """The GGUF a converted folder came from; None for a folder that is not one (or half written)."""
    try:
        source = json.loads((folder / CONFIG_FILE).read_text()).get("source")
    except (OSError, ValueError, AttributeError):
        return None
    return source if isinstance(source, str) and source else None


def stale_folders(cache_dir: Path, current: Path | None = None) -> list[Path]:
    """Converted folders whose GGUF is gone, and, given the folder of a GGUF's `current` version,
    the folders of its older versions. Half-written `.converting-*` folders are another process's
    work in progress and are never listed."""
    if not cache_dir.is_dir():
        return []
    current_source = source_of(current) if current is not None else None
    stale = []
    for folder in sorted(cache_dir.iterdir()):
        if folder.name.startswith(".") or not folder.is_dir() or folder == current:
            continue
        source = source_of(folder)
        if source is None:
            continue
        if not Path(source).is_file() or (current_source is not None and source == current_source):
            stale.append(folder)
    return stale


def remove_stale(cache_dir: Path, current: Path | None = None) -> list[Path]:
    """Delete what `stale_folders` lists; the folders removed."""
    stale = stale_folders(cache_dir, current)
    for folder in stale:
        shutil.rmtree(folder, ignore_errors=True)
    return stale
