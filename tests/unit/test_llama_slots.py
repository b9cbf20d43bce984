"""A chat slot's lifecycle (workers/engines/llama/slots.py): FREE -> PREFILL -> DECODE -> FREE, one
reset that drops everything of the request, and the KV policy around it, without a model."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, cast

import pytest

from protocol.wire import Generate, Started
from workers.engines.llama import slots as slots_mod
from workers.engines.llama.media import MediaPrompt
from workers.engines.llama.sampling import Sampler
from workers.engines.llama.slots import Queued, Run, Slot, Slots, SlotState, SlotStateError
from workers.engines.llama.text_stream import TextStream

# What a slot keeps across requests; everything else of a request is in its Run.
DURABLE = {"seq", "history", "tenant", "cacheable", "pinned", "used"}


class FakeSampler:
    def __init__(self) -> None:
        self.freed = 0

    def free(self) -> None:
        self.freed += 1


class FakeMedia:
    def __init__(self) -> None:
        self.freed = 0

    def free(self) -> None:
        self.freed += 1


def make_run(prompt: list[int], *, media: FakeMedia | None = None) -> tuple[Run, FakeSampler]:
    sampler = FakeSampler()
    req = Generate(req_id=7, log_id="r7", prompt="x", cache_key="tenant")
    run = Run(req, cast(Sampler, sampler), TextStream([]), pending_prompt=list(prompt), n_prompt=len(prompt),
              n_cached=0, n_past=0, max_tokens=16, started=1.0,
              media=cast(MediaPrompt, media) if media is not None else None)  # fmt: skip
    return run, sampler


def test_a_request_goes_through_prefill_and_decode_and_back_to_free() -> None:
    slot = Slot(seq=0)
    assert slot.state is SlotState.FREE
    run, sampler = make_run([1, 2, 3])
    slot.start(run)
    assert slot.state is SlotState.PREFILL and slot.run is run
    assert slot.feed(2) == [1, 2]
    assert slot.state is SlotState.PREFILL  # a prompt key is still to come
    assert slot.feed(5) == [3]
    assert slot.state is SlotState.DECODE and run.pending_prompt == []
    slot.reset()
    assert slot.state is SlotState.FREE
    assert sampler.freed == 1


def test_a_request_may_leave_while_prefilling() -> None:
    """Cancelled, or failed on an image, before its prompt is all in."""
    slot = Slot(seq=0)
    media = FakeMedia()
    run, sampler = make_run([1, 2, 3], media=media)
    slot.start(run)
    slot.feed(1)
    slot.reset()
    assert slot.state is SlotState.FREE
    assert (sampler.freed, media.freed) == (1, 1)


def test_feeding_nothing_keeps_prefilling() -> None:
    slot = Slot(seq=0)
    slot.start(make_run([1])[0])
    assert slot.feed(0) == []
    assert slot.state is SlotState.PREFILL


def test_reset_leaves_nothing_of_the_request_and_keeps_the_kv_tags() -> None:
    slot = Slot(seq=3)
    run, _ = make_run([1, 2])
    slot.start(run)
    slot.feed(2)
    # Everything a request changes while it runs.
    run.n_gen, run.last_token, run.row, run.held, run.last_emit, run.n_past = 5, 42, 9, "abc", 2.0, 7
    run.logprobs = []
    slot.history, slot.tenant, slot.cacheable, slot.pinned, slot.used = [1, 2, 42], "t", True, True, 3.0
    slot.reset()

    fresh = Slot(seq=3)
    per_request = {f.name for f in dataclasses.fields(Slot)} - DURABLE
    assert per_request == {"state", "_run"}  # a new per-request field belongs in Run, where reset drops it
    for name in per_request:
        assert getattr(slot, name) == getattr(fresh, name), name
    with pytest.raises(SlotStateError):
        _ = slot.run
    # What describes the KV the slot still holds is Slots' to keep or clear.
    assert (slot.history, slot.tenant, slot.cacheable, slot.pinned, slot.used) == ([1, 2, 42], "t", True, True, 3.0)


@pytest.mark.parametrize("state", [SlotState.FREE, SlotState.PREFILL, SlotState.DECODE])
def test_illegal_transitions_raise_and_change_nothing(state: SlotState) -> None:
    slot = Slot(seq=0)
    run, sampler = make_run([1, 2])
    if state is not SlotState.FREE:
        slot.start(run)
    if state is SlotState.DECODE:
        slot.feed(2)
    before = (slot.state, slot._run)

    other, _ = make_run([5])
    if state is not SlotState.FREE:
        with pytest.raises(SlotStateError):
            slot.start(other)  # a busy slot never takes a second request
    if state is not SlotState.PREFILL:
        with pytest.raises(SlotStateError):
            slot.feed(1)  # only a prefilling slot has a prompt to feed
    if state is SlotState.FREE:
        with pytest.raises(SlotStateError):
            slot.reset()  # a second release would free the sampler twice
        with pytest.raises(SlotStateError):
            _ = slot.run
    assert (slot.state, slot._run) == before
    assert sampler.freed == 0


def test_a_request_with_no_prompt_to_evaluate_is_refused() -> None:
    """There must be logits to sample the first token from."""
    slot = Slot(seq=0)
    with pytest.raises(SlotStateError):
        slot.start(make_run([])[0])
    assert slot.state is SlotState.FREE


@pytest.fixture
def removed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """The KV removals Slots asks llama.cpp for (there is no context here)."""
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(slots_mod.L, "llama_memory_seq_rm", lambda mem, seq, p0, p1: calls.append((seq, p0, p1)))
    return calls


@pytest.fixture
def slots(removed: list[tuple[int, int, int]]) -> Slots:
    return Slots(cast(Any, None), cast(Any, None), parallel=2, nctx=64, cache_bytes=0)


REQ_IDS = itertools.count(100)


def admit(slots: Slots, tokens: list[int], *, cache: bool = True) -> tuple[Slot, FakeSampler, list[object]]:
    sampler = FakeSampler()
    req = Generate(req_id=next(REQ_IDS), log_id="r", prompt="x", cache=cache, cache_key="t", max_tokens=8)
    slots.waiting.append(Queued(req, tokens, cast(Sampler, sampler)))
    out: list[object] = []
    slots.admit(out.append, lambda cfg: pytest.fail("no speculation asked"))
    slot = slots.find(req.req_id)
    assert slot is not None
    return slot, sampler, out


def test_admit_starts_a_prefill_and_release_frees_it(slots: Slots) -> None:
    slot, sampler, out = admit(slots, [1, 2, 3, 4])
    assert slot.state is SlotState.PREFILL
    assert isinstance(out[0], Started) and out[0].prompt_tokens == 4
    run = slot.run
    assert (run.pending_prompt, run.n_past, run.max_tokens) == ([1, 2, 3, 4], 0, 8)
    assert (slot.history, slot.tenant) == ([1, 2, 3, 4], "t")
    assert slots.running() == 1 and slots.free() == [s for s in slots if s is not slot]
    run.n_past += len(slot.feed(4))
    slot.history.append(9)  # sampled, not yet decoded
    slots.release(slot, completed=True)
    assert slot.state is SlotState.FREE and sampler.freed == 1
    assert slot.history == [1, 2, 3, 4] and slot.cacheable  # its KV stays for the tenant's next turn
    assert slots.running() == 0 and slots.find(run.req.req_id) is None


def test_the_next_turn_reuses_the_kept_kv_in_place(slots: Slots) -> None:
    slot, _, _ = admit(slots, [1, 2, 3, 4])
    slot.run.n_past += len(slot.feed(4))
    slots.release(slot, completed=True)
    again, _, out = admit(slots, [1, 2, 3, 4, 5, 6])
    assert again is slot
    assert isinstance(out[0], Started) and out[0].cached_tokens == 4
    assert (again.run.pending_prompt, again.run.n_past, again.run.n_cached) == ([5, 6], 4, 4)


@pytest.mark.parametrize("phase", ["prefill", "cancelled", "no-cache"])
def test_a_request_that_did_not_complete_leaves_no_kv(
    slots: Slots, removed: list[tuple[int, int, int]], phase: str
) -> None:
    slot, sampler, _ = admit(slots, [1, 2, 3, 4], cache=phase != "no-cache")
    if phase != "prefill":
        slot.run.n_past += len(slot.feed(4))
    slots.release(slot, completed=phase != "cancelled")
    assert slot.state is SlotState.FREE and sampler.freed == 1
    assert slot.history == [] and not slot.cacheable
    assert removed[-1] == (slot.seq, -1, -1)


def test_close_releases_every_busy_slot_once(slots: Slots) -> None:
    a, sa, _ = admit(slots, [1, 2])
    b, sb, _ = admit(slots, [3, 4])
    b.feed(2)
    slots.close()
    assert a.state is b.state is SlotState.FREE
    assert (sa.freed, sb.freed) == (1, 1)
