"""The server's running pulls (gateway/models/pulls.py) against a fake download: one download per
model however many follow it, replay for late joiners, byte counts throttled but every file's last
one delivered, cancel when the last follower leaves, errors and shutdown as the followers' results.
Then the parts of gateway/models/pull.py that the hub double cannot provoke: a full disk, a damaged
file, the progress bar that reports and cancels."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.errors import GenieXError, ModelNotFound, Overloaded
from gateway.models import pull as hub_pull
from gateway.models.pulls import Follower, Pulls
from gateway.models.store import ModelEntry, ModelStore
from protocol.pull import PullProgress

MIB = 1 << 20
STORE = ModelStore(Path("/nonexistent-geniex-store"), bundled=[])


def entry(name: str) -> ModelEntry:
    org, _, rest = name.partition("/")
    repo, _, precision = rest.partition(":")
    precision = precision.upper() or "Q4_0"
    return ModelEntry(id=f"{org}/{repo}:{precision}", org=org, repo=repo, precision=precision, engine="llama_cpp",
                      path="/m.gguf", size=1, created=0)  # fmt: skip


class FakeDownload:
    """Reports a manifest, `steps` byte counts of one file `pause` apart, then success; stops when cancelled.
    `hold`: wait there (after the first byte count) until released or cancelled."""

    def __init__(self, steps: int = 10, pause: float = 0.0, fail: Exception | None = None, hold: bool = False) -> None:
        self.steps, self.pause, self.fail = steps, pause, fail
        self.calls = 0
        self.release = threading.Event()
        self.hold = hold
        self.cancelled = threading.Event()

    def __call__(self, store: ModelStore, name: str, report: Callable[[PullProgress], None],
                 cancel: threading.Event) -> ModelEntry:  # fmt: skip
        self.calls += 1
        total = self.steps * MIB
        report(PullProgress("manifest"))
        if self.fail is not None:
            raise self.fail
        report(PullProgress("downloading", "m.gguf", "sha256:" + "ab" * 32, total, 0))
        for i in range(1, self.steps + 1):
            if cancel.is_set():
                self.cancelled.set()
                raise hub_pull.PullCancelled(f"the pull of {name} was cancelled")
            report(PullProgress("downloading", "m.gguf", "sha256:" + "ab" * 32, total, i * MIB))
            if self.hold and i == 1:
                while not self.release.wait(0.01):
                    if cancel.is_set():
                        self.cancelled.set()
                        raise hub_pull.PullCancelled(f"the pull of {name} was cancelled")
            time.sleep(self.pause)
        for phase in ("verifying", "writing", "success"):
            report(PullProgress(phase))
        return entry(name)


async def collect(follower: Follower, delay: float = 0.0) -> list[PullProgress]:
    got = []
    async for step in follower.progress():
        if step is not None:
            got.append(step)
        await asyncio.sleep(delay)
    return got


def byte_counts(steps: list[PullProgress]) -> list[int]:
    return [s.completed for s in steps if s.phase == "downloading"]


async def test_a_pull_reports_every_phase_and_ends_at_its_total() -> None:
    pulls = Pulls(FakeDownload(steps=5))
    follower = pulls.follow(STORE, "acme/Tiny-GGUF:q4_0")
    steps = await collect(follower)
    follower.leave()
    phases = [s.phase for s in steps]
    assert phases[0] == "manifest" and phases[-3:] == ["verifying", "writing", "success"]
    counts = byte_counts(steps)
    assert counts[0] == 0 and counts[-1] == 5 * MIB and counts == sorted(counts)
    assert follower.result().id == "acme/Tiny-GGUF:Q4_0"
    assert pulls.running == {}, "a finished pull leaves the table"


async def test_byte_counts_are_throttled_but_the_last_always_arrives() -> None:
    # 400 byte counts in about 0.4 s: a follower ticking every 0.1 s sees a handful, and the total.
    pulls = Pulls(FakeDownload(steps=400, pause=0.001), tick_s=0.1)
    follower = pulls.follow(STORE, "acme/Fast-GGUF")
    began = time.monotonic()
    counts = byte_counts(await collect(follower))
    took = time.monotonic() - began
    follower.leave()
    assert counts[0] == 0 and counts[-1] == 400 * MIB
    assert len(counts) <= 2 + took / 0.1 + 1 < 400, (counts, took)
    assert counts == sorted(counts)


async def test_a_slow_reader_still_sees_every_phase_in_order() -> None:
    pulls = Pulls(FakeDownload(steps=50, pause=0.002), tick_s=0.01)
    follower = pulls.follow(STORE, "acme/Slow-reader-GGUF")
    began = time.monotonic()
    steps = await collect(follower, delay=0.05)  # reads slower than the download reports
    took = time.monotonic() - began
    follower.leave()
    phases = [s.phase for s in steps]
    assert phases[0] == "manifest" and phases[-3:] == ["verifying", "writing", "success"]
    counts = byte_counts(steps)
    assert counts == sorted(counts) and counts[-1] == 50 * MIB
    assert len(counts) <= 3 + took / 0.05 < 50, "byte counts that went stale while it slept were skipped"


async def test_two_clients_of_one_model_share_one_download() -> None:
    fake = FakeDownload(steps=20, pause=0.01)
    pulls = Pulls(fake, tick_s=0.02)
    a = pulls.follow(STORE, "acme/Shared-GGUF:Q8_0")
    first = a.progress()
    assert (await anext(first)).phase == "manifest"  # type: ignore[union-attr]
    await asyncio.sleep(0.05)  # the download is under way when the second client comes
    b = pulls.follow(STORE, "acme/Shared-GGUF:q8_0")  # the same model: the precision's case does not matter
    assert b.download is a.download

    async def rest() -> list[PullProgress]:
        return [s async for s in first if s is not None]

    steps_a, steps_b = await asyncio.gather(rest(), collect(b))
    a.leave()
    b.leave()
    assert fake.calls == 1
    assert steps_b[0].phase == "manifest", "a late joiner is shown what happened before it came"
    assert byte_counts(steps_a)[-1] == byte_counts(steps_b)[-1] == 20 * MIB
    assert a.result() is b.result()


async def test_different_models_download_apart() -> None:
    fake = FakeDownload(steps=2)
    pulls = Pulls(fake)
    a, b = pulls.follow(STORE, "acme/One-GGUF"), pulls.follow(STORE, "acme/One-GGUF:Q8_0")
    assert a.download is not b.download
    await asyncio.gather(a.wait(), b.wait())
    assert fake.calls == 2


async def test_the_download_is_cancelled_when_its_last_follower_leaves() -> None:
    fake = FakeDownload(steps=5, hold=True)
    pulls = Pulls(fake)
    a = pulls.follow(STORE, "acme/Gone-GGUF")
    b = pulls.follow(STORE, "acme/Gone-GGUF")
    a.leave()
    a.leave()  # leaving twice counts once
    await asyncio.sleep(0.05)
    assert not a.download.cancel.is_set(), "one client still follows it"
    b.leave()
    assert a.download.cancel.is_set() and pulls.running == {}
    assert await asyncio.to_thread(fake.cancelled.wait, 5)
    # A pull of the same model from now on starts afresh rather than joining the cancelled one.
    c = pulls.follow(STORE, "acme/Gone-GGUF")
    assert c.download is not a.download
    fake.release.set()
    assert (await c.wait()).id == "acme/Gone-GGUF:Q4_0"
    assert fake.calls == 2


async def test_a_follower_cancelled_while_waiting_leaves() -> None:
    fake = FakeDownload(steps=5, hold=True)
    pulls = Pulls(fake)
    follower = pulls.follow(STORE, "acme/Waiter-GGUF")
    task = asyncio.create_task(follower.wait())
    await asyncio.sleep(0.05)
    task.cancel()  # what a client's disconnect does to a `stream: false` request
    with pytest.raises(asyncio.CancelledError):
        await task
    assert follower.left and follower.download.cancel.is_set()
    assert await asyncio.to_thread(fake.cancelled.wait, 5)


async def test_a_failure_is_every_followers_result() -> None:
    pulls = Pulls(FakeDownload(fail=ModelNotFound("no model repository acme/nope on Hugging Face")))
    a, b = pulls.follow(STORE, "acme/nope"), pulls.follow(STORE, "acme/nope")
    for follower in (a, b):
        with pytest.raises(ModelNotFound, match="no model repository acme/nope"):
            await follower.wait()
    assert pulls.running == {}


async def test_an_unexpected_exception_is_a_500_that_hides_it() -> None:
    pulls = Pulls(FakeDownload(fail=ZeroDivisionError("secret internals")))
    with pytest.raises(GenieXError) as caught:
        await pulls.follow(STORE, "acme/Bug-GGUF").wait()
    assert caught.value.status == 500 and "secret" not in caught.value.message


async def test_shutdown_cancels_running_pulls_with_a_503() -> None:
    fake = FakeDownload(steps=5, hold=True)
    pulls = Pulls(fake)
    follower = pulls.follow(STORE, "acme/Shutdown-GGUF")
    waiting = asyncio.create_task(follower.wait())
    await asyncio.sleep(0.05)
    pulls.cancel_all()
    assert fake.cancelled.is_set(), "cancel_all waits for the download to stop"
    with pytest.raises(Overloaded, match="shutting down"):
        await waiting
    pulls.cancel_all()  # nothing left: a no-op


async def test_a_quiet_download_sends_keep_alives() -> None:
    fake = FakeDownload(steps=2, hold=True)
    pulls = Pulls(fake)
    follower = pulls.follow(STORE, "acme/Quiet-GGUF")
    seen: list[PullProgress | None] = []
    async for step in follower.progress(keepalive_s=0.05):
        seen.append(step)
        if seen.count(None) == 2:
            fake.release.set()
    follower.leave()
    assert None in seen and seen[-1] is not None and seen[-1].phase == "success"


# ---------------------------------------------------------------- gateway/models/pull.py


def test_a_full_disk_is_507_naming_it() -> None:
    exc = hub_pull._translate(OSError(errno.ENOSPC, "No space left on device"), "acme/x", "x-Q4_0.gguf")
    assert isinstance(exc, hub_pull.DiskFull) and exc.status == 507
    assert "disk is full" in exc.message and "acme/x/x-Q4_0.gguf" in exc.message
    other = hub_pull._translate(OSError(errno.EIO, "I/O error"), "acme/x", None)
    assert isinstance(other, hub_pull.PullFailed)


def test_a_download_larger_than_the_free_space_is_refused_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staging = ModelStore(tmp_path, bundled=[]).staging_dir()
    monkeypatch.setattr(hub_pull.shutil, "disk_usage", lambda _: type("U", (), {"free": 5_000_000})())
    fetches = [hub_pull.Fetch("m.gguf", "", 4_000_000), hub_pull.Fetch("mmproj.gguf", "", 2_000_000)]
    with pytest.raises(hub_pull.DiskFull, match=r"needs 6.00 MB, the data dir .* has 5.00 MB free"):
        hub_pull._check_space(staging, fetches, "acme/x:Q4_0")
    hub_pull._check_space(staging, fetches[:1], "acme/x:Q4_0")


def test_a_damaged_file_fails_its_digest_check(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 1000)
    good = hub_pull.Fetch("m.gguf", "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest(), 1004)
    hub_pull.verify(path, good, "acme/x", lambda: None)
    bad = hub_pull.Fetch("m.gguf", "sha256:" + "0" * 64, 1004)
    with pytest.raises(hub_pull.PullFailed, match="arrived damaged"):
        hub_pull.verify(path, bad, "acme/x", lambda: None)
    hub_pull.verify(path, hub_pull.Fetch("m.gguf", "", 1004), "acme/x", lambda: None)  # no hash: no check


def test_the_progress_bar_reports_bytes_and_raises_once_cancelled() -> None:
    seen: list[PullProgress] = []
    cancel = threading.Event()

    def check() -> None:
        if cancel.is_set():
            raise hub_pull.PullCancelled("cancelled")

    f = hub_pull.Fetch("m.gguf", "sha256:" + "cd" * 32, 100)
    # As huggingface_hub makes it (http_get): quiet, as the server asks.
    bar = hub_pull._bar_class(f, seen.append, check, quiet=True)(total=100, initial=10, desc="m.gguf", unit="B")
    bar.update(30)
    bar.update_transfer(30)
    assert seen == [PullProgress("downloading", "m.gguf", f.digest, 100, 40)]
    cancel.set()
    with pytest.raises(hub_pull.PullCancelled):
        bar.update(10)
    with pytest.raises(hub_pull.PullCancelled):
        bar.update_transfer(10)
    bar.close()
