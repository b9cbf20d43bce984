"""The prompt cache's disk tier on its own (workers/engines/llama/disk_cache.py), with states of
made-up bytes: what goes in comes back only to its tenant and its fingerprint, whole and checked;
the cap evicts least recently used, pinned last; bad files are refused; a full disk is counted."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from workers.engines.llama.disk_cache import DiskCache, DiskEntry

FP = "f" * 32


def state(n: int, fill: int = 7) -> ctypes.Array[ctypes.c_uint8]:
    return (ctypes.c_uint8 * n).from_buffer_copy(bytes([fill]) * n)


def settled(cache: DiskCache) -> DiskCache:
    """The cache after its writer thread has written what was queued (close waits for it)."""
    cache.close()
    return cache


def test_a_state_comes_back_to_its_tenant_whole(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, 1 << 20, FP)
    cache.put("alice", [1, 2, 3, 4], state(1000, 9))
    settled(cache)
    again = DiskCache(tmp_path, 1 << 20, FP)  # a new worker, the same folder
    entry, n = again.best("alice", [1, 2, 3, 4, 5])
    assert entry is not None and n == 4
    loaded = again.load(entry)
    assert loaded is not None and bytes(loaded) == bytes([9]) * 1000
    assert again.best("bob", [1, 2, 3, 4, 5]) == (None, 0)  # another tenant sees nothing
    assert DiskCache(tmp_path, 1 << 20, "0" * 32).best("alice", [1, 2, 3, 4]) == (None, 0)  # another model
    files = list((tmp_path / FP).glob("*.kv"))
    assert len(files) == 1 and files[0].stat().st_mode & 0o777 == 0o600
    assert (tmp_path / FP).stat().st_mode & 0o777 == 0o700 and tmp_path.stat().st_mode & 0o777 == 0o700
    assert b"alice" not in files[0].read_bytes()  # the tenant is a keyed hash


def test_the_cap_evicts_least_recently_used_and_pinned_last(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, 3500, FP)
    cache.put("t", [1] * 10, state(1000), pinned=True)
    cache.put("t", [2] * 10, state(1000))
    cache.put("t", [3] * 10, state(1000))
    cache.put("t", [4] * 10, state(1000))  # over the cap: [2] goes, not the pinned [1]
    settled(cache)
    kept = sorted(e.tokens[0] for e in cache.entries)
    assert kept == [1, 3, 4] and cache.bytes <= 3500 and cache.stats.evictions == 1
    assert len(list((tmp_path / FP).glob("*.kv"))) == 3


def test_a_longer_state_of_the_same_conversation_replaces_its_prefix(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, 1 << 20, FP)
    cache.put("t", [1, 2, 3], state(100))
    cache.put("t", [1, 2, 3, 4, 5], state(200))
    cache.put("u", [1, 2], state(50))  # another tenant's prefix stays
    settled(cache)
    assert sorted((e.tenant == cache._tenant("t"), len(e.tokens)) for e in cache.entries) == [(False, 2), (True, 5)]
    assert len(list((tmp_path / FP).glob("*.kv"))) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_a_damaged_file_is_skipped_and_deleted(tmp_path: Path, damage: str) -> None:
    cache = DiskCache(tmp_path, 1 << 20, FP)
    cache.put("t", [1, 2, 3], state(1000))
    settled(cache)
    (path,) = list((tmp_path / FP).glob("*.kv"))
    raw = path.read_bytes()
    path.write_bytes({"truncate": raw[: len(raw) // 2], "flip": raw[:-1] + bytes([raw[-1] ^ 0xFF]),
                      "garbage": os.urandom(len(raw)), "empty": b""}[damage])  # fmt: skip
    fresh = DiskCache(tmp_path, 1 << 20, FP)
    entry, _ = fresh.best("t", [1, 2, 3])
    if entry is not None:  # a flipped state byte passes the scan; the checksum refuses it on load
        assert fresh.load(entry) is None
    assert not path.exists() and fresh.stats.skipped == 1 and fresh.best("t", [1, 2, 3]) == (None, 0)


def test_a_failed_write_is_counted_and_nothing_is_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = DiskCache(tmp_path, 1 << 20, FP)

    def full(*_args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    cache.put("t", [1, 2, 3], state(1000))
    settled(cache)
    assert cache.stats.write_errors == 1 and cache.entries == [] and not list((tmp_path / FP).iterdir())


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="mounting a tmpfs needs root")
def test_a_full_disk_is_counted_and_the_cache_goes_on(tmp_path: Path) -> None:
    disk = tmp_path / "small"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("tmpfs cannot be mounted here")
    try:
        cache = DiskCache(disk, 1 << 20, FP)
        cache.put("t", [1], state(40_000))
        cache.put("t", [2], state(40_000))  # no room left on the device
        cache.put("t", [3], state(1000))
        settled(cache)
        assert cache.stats.write_errors == 1 and cache.stats.writes == 2, cache.stats
        assert not [p for p in (disk / FP).iterdir() if ".tmp" in p.name]
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_off_when_the_cap_is_zero_or_the_folder_cannot_be_made(tmp_path: Path) -> None:
    assert not DiskCache(tmp_path / "a", 0, FP).put("t", [1], state(10))
    (tmp_path / "file").write_text("")
    blocked = DiskCache(tmp_path / "file" / "sub", 1 << 20, FP)  # under a file: no folder
    assert blocked.cap == 0 and not blocked.put("t", [1], state(10))
    assert isinstance(DiskEntry(tmp_path, "t", [1], 1).used, float)


def test_a_scan_removes_a_crashed_writers_temporary_file_but_not_a_live_ones(tmp_path: Path) -> None:
    """Two workers of a model (say cpu and gpu at one nctx) share a folder: a new one's scan must
    not delete the file the other is writing."""
    folder = tmp_path / FP
    folder.mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    live, crashed = folder / f"a.tmp{os.getpid()}", folder / f"b.tmp{dead.pid}"
    live.write_bytes(b"x")
    crashed.write_bytes(b"x")
    DiskCache(tmp_path, 1 << 20, FP).close()
    assert live.exists() and not crashed.exists()
