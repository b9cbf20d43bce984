"""Saved sequence states on disk: a conversation's KV outlives its worker (an idle stop, an
eviction by another model, a restart, a laptop's sleep), under the RAM tier (`prompt_cache.py`).

A file holds one state: a header (what wrote it, whose it is, the tokens it covers, a checksum)
and llama.cpp's saved sequence state. It is written when the worker would otherwise lose that KV:
the RAM tier evicting it, or the worker closing with KV still in its slots and its RAM tier. Files
are named by a hash of the state's tenant and tokens, never by either; the tenant is kept only as
a keyed hash. A state is used only by the same model file, llama.cpp build, context size and KV
types (the fingerprint, in the folder's name and in every header); anything else, truncated or
corrupt, is skipped with a warning and deleted, never loaded. Writes are atomic (a temporary name,
then a rename) and done by a thread of their own, so a decode step only hands the bytes over.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import structlog

from workers.engines.llama.prompt_cache import State, common_prefix

log = structlog.get_logger("worker.cache")

MAGIC = b"GXKV1\n"
SUFFIX = ".kv"
# A header larger than this is not one of ours (the token list of a 128k context is about 1 MB).
MAX_HEADER = 8 << 20
# How long closing waits for the writes it queued (the gateway gives a stopping worker 10 s).
CLOSE_WAIT_S = 8.0


class Header(msgspec.Struct, array_like=True):
    fingerprint: str
    tenant: str  # keyed hash of the tenant
    tokens: list[int]
    pinned: bool
    state_bytes: int
    checksum: str  # blake2b of the state


@dataclass
class DiskEntry:
    path: Path
    tenant: str
    tokens: list[int]
    size: int
    pinned: bool = False
    used: float = field(default_factory=time.time)


class DiskCacheStats(msgspec.Struct):
    hits: int = 0
    writes: int = 0
    write_errors: int = 0
    evictions: int = 0
    skipped: int = 0  # files refused: foreign, truncated, corrupt


def fingerprint(model_path: str, build: str, nctx: int, kv_types: str) -> str:
    """What a state depends on: the model file (path, size, modification time), the llama.cpp build,
    the context size a sequence has, and the KV cache's types."""
    st = os.stat(model_path)
    text = "\0".join([os.path.realpath(model_path), str(st.st_size), str(st.st_mtime_ns), build, str(nctx), kv_types])
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class DiskCache:
    def __init__(self, root: Path, cap_bytes: int, fingerprint: str) -> None:
        self.cap = max(0, cap_bytes)
        self.fingerprint = fingerprint
        self.folder = root / fingerprint
        self.stats = DiskCacheStats()
        self.entries: list[DiskEntry] = []
        self.bytes = 0
        self._writes: queue.Queue[tuple[DiskEntry, State] | None] = queue.Queue()
        self._lock = threading.Lock()  # entries and bytes: the writer thread evicts too
        self._key = b""
        if not self.cap:
            return
        try:
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(root, 0o700)
            self.folder.mkdir(mode=0o700, exist_ok=True)
            self._key = _tenant_key(root)
            self._scan()
        except OSError as exc:
            log.warning(
                "the prompt cache's disk tier is off: its folder cannot be used", folder=str(root), error=str(exc)
            )
            self.cap = 0
            return
        self._writer = threading.Thread(target=self._write_loop, name="disk-cache", daemon=True)
        self._writer.start()

    # ---- lookups ----------------------------------------------------------------

    def best(self, tenant: str, tokens: list[int]) -> tuple[DiskEntry | None, int]:
        """The entry of `tenant` sharing the longest token prefix with `tokens`, and that length."""
        if not self.cap:
            return None, 0
        who = self._tenant(tenant)
        best, best_n = None, 0
        with self._lock:
            for e in self.entries:
                if e.tenant == who:
                    n = common_prefix(e.tokens, tokens)
                    if n > best_n:
                        best, best_n = e, n
        return best, best_n

    def load(self, entry: DiskEntry) -> State | None:
        """The state an entry holds, checked against its header; None (the file deleted) when it is
        not what the index says, or not intact."""
        try:
            with open(entry.path, "rb") as f:
                header = self._read_header(f, entry.path)
                if header is None:  # refused (and deleted) there
                    with self._lock:
                        self._forget(entry)
                    return None
                if header.tokens != entry.tokens:
                    raise ValueError("its header changed")
                data = f.read(header.state_bytes + 1)
            if len(data) != header.state_bytes:
                raise ValueError(f"{len(data)} bytes of state where the header says {header.state_bytes}")
            if hashlib.blake2b(data, digest_size=16).hexdigest() != header.checksum:
                raise ValueError("its checksum does not match")
        except (OSError, ValueError) as exc:
            self._refuse(entry.path, str(exc))
            with self._lock:
                self._forget(entry)
            return None
        entry.used = time.time()
        try:
            os.utime(entry.path)  # least recently used across restarts too
        except OSError:  # another worker of the model, sharing the folder, evicted it since: the state is read
            pass
        self.stats.hits += 1
        return (ctypes.c_uint8 * len(data)).from_buffer_copy(data)

    # ---- writes -----------------------------------------------------------------

    def put(self, tenant: str, tokens: list[int], state: State, pinned: bool = False, age_s: float = 0.0) -> bool:
        """Queue a state for writing; the writer thread hashes and writes it, so the caller (a
        decode step) only hands it over. `state` is not written to after this (a saved state is
        never changed in place). `age_s`: how long ago it was last used (its rank for eviction).
        False when it cannot be kept (off, or larger than the cap)."""
        if not self.cap or len(state) > self.cap:
            return False
        who = self._tenant(tenant)
        self._writes.put((DiskEntry(self.folder, who, list(tokens), len(state), pinned, time.time() - age_s), state))
        return True

    def close(self) -> None:
        """Finish the queued writes (bounded: a stopping worker has seconds)."""
        if not self.cap:
            return
        self._writes.put(None)
        self._writer.join(CLOSE_WAIT_S)
        if self._writer.is_alive():
            log.warning("closing before every prompt state was written to disk", left=self._writes.qsize())

    def _write_loop(self) -> None:
        while (item := self._writes.get()) is not None:
            entry, state = item
            t0 = time.perf_counter()
            data = memoryview(state).cast("B")
            header = msgspec.msgpack.encode(Header(self.fingerprint, entry.tenant, entry.tokens, entry.pinned, len(data),
                                                   hashlib.blake2b(data, digest_size=16).hexdigest()))  # fmt: skip
            name = hashlib.blake2b(entry.tenant.encode() + b"\0" + b",".join(str(t).encode() for t in entry.tokens),
                                   digest_size=16).hexdigest()  # fmt: skip
            entry.path = self.folder / (name + SUFFIX)
            entry.size = len(MAGIC) + 4 + len(header) + len(data)
            tmp = entry.path.with_suffix(f".tmp{os.getpid()}")
            used = entry.used
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(MAGIC + len(header).to_bytes(4, "little") + header)
                    f.write(data)
                os.utime(tmp, (used, used))  # the next worker's scan ranks it by this
                os.replace(tmp, entry.path)
            except OSError as exc:
                self.stats.write_errors += 1
                log.warning("a prompt state could not be written to disk", error=str(exc), bytes=entry.size)
                tmp.unlink(missing_ok=True)
                continue
            self.stats.writes += 1
            with self._lock:
                # Entries of the tenant whose tokens this one extends hold nothing it does not.
                for e in [e for e in self.entries if e.tenant == entry.tenant
                          and common_prefix(e.tokens, entry.tokens) == len(e.tokens)]:  # fmt: skip
                    entry.pinned = entry.pinned or e.pinned
                    if e.path != entry.path:
                        e.path.unlink(missing_ok=True)
                    self._forget(e)
                self.entries.append(entry)
                self.bytes += entry.size
                self._evict()
            log.debug("prompt state written to disk", tokens=len(entry.tokens), bytes=entry.size,
                      ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip

    def _evict(self) -> None:
        while self.bytes > self.cap and self.entries:
            victim = min(self.entries, key=lambda e: (e.pinned, e.used))
            victim.path.unlink(missing_ok=True)
            self._forget(victim)
            self.stats.evictions += 1

    def _forget(self, e: DiskEntry) -> None:
        if e in self.entries:
            self.entries.remove(e)
            self.bytes -= e.size

    # ---- the folder -------------------------------------------------------------

    def _scan(self) -> None:
        """Index the states a previous worker left (headers only), refusing what is not ours."""
        for path in sorted(self.folder.iterdir()):
            if not path.name.endswith(SUFFIX):
                if ".tmp" in path.name and not _writer_alive(path):  # a write cut short by a crash
                    path.unlink(missing_ok=True)
                continue
            try:
                with open(path, "rb") as f:
                    header = self._read_header(f, path)
                if header is None:  # refused (and deleted) there
                    continue
                size = path.stat().st_size
                if size != len(MAGIC) + 4 + len(msgspec.msgpack.encode(header)) + header.state_bytes:
                    raise ValueError(f"{size} bytes, not what its header says")
            except (OSError, ValueError) as exc:
                self._refuse(path, str(exc))
                continue
            self.entries.append(
                DiskEntry(path, header.tenant, header.tokens, size, header.pinned, path.stat().st_mtime)
            )
            self.bytes += size
        self._evict()

    def _read_header(self, f: object, path: Path) -> Header | None:
        read = f.read  # type: ignore[attr-defined]
        if read(len(MAGIC)) != MAGIC:
            self._refuse(path, "not a GenieX prompt state")
            return None
        n = int.from_bytes(read(4), "little")
        if not 0 < n <= MAX_HEADER:
            raise ValueError(f"a header of {n} bytes")
        try:
            header = msgspec.msgpack.decode(read(n), type=Header)
        except msgspec.DecodeError as exc:
            raise ValueError(f"its header does not decode: {exc}") from None
        if header.fingerprint != self.fingerprint:
            self._refuse(path, "written by another model, llama.cpp build, context size or KV type")
            return None
        return header

    def _refuse(self, path: Path, why: str) -> None:
        self.stats.skipped += 1
        log.warning("prompt state skipped and deleted", file=path.name, reason=why)
        path.unlink(missing_ok=True)

    def _tenant(self, tenant: str) -> str:
        return hashlib.blake2b(tenant.encode(), key=self._key, digest_size=16).hexdigest()


def _writer_alive(tmp: Path) -> bool:
    """Whether the process whose pid names a temporary file (`.tmp<pid>`) still runs: another worker
    of the model, sharing the folder, may be writing it now."""
    pid = tmp.name.rpartition(".tmp")[2]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tenant_key(root: Path) -> bytes:
    """A random key kept beside the states (0600): the tenant hashes in headers are keyed, so a
    file does not tell whose it is to anyone without the data dir."""
    path = root / "tenant.key"
    try:
        return path.read_bytes()[:32] or _new_key(path)
    except FileNotFoundError:
        return _new_key(path)


def _new_key(path: Path) -> bytes:
    key = os.urandom(32)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    try:
        os.link(tmp, path)  # another worker may have made one first: then its key is the key
    except FileExistsError:
        key = path.read_bytes()[:32]
    finally:
        tmp.unlink(missing_ok=True)
    return key
