"""The chat engine's order (workers/engines/llama/schedule.py): the queue by priority with aging,
background requests kept off the last free slot, and background sequences paused, never dropped,
while interactive work runs, one step each MAX_PAUSE_S."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.priority import AGING_S, MAX_PAUSE_S
from workers.engines.llama.schedule import by_rank, next_waiting, paused


@dataclass
class Q:
    priority: str
    queued_at: float = 0.0


@dataclass
class R:
    priority: str
    paused_since: float | None = None


def test_the_queue_takes_interactive_first_then_arrival() -> None:
    waiting = [Q("background"), Q("normal"), Q("interactive"), Q("interactive")]
    assert next_waiting(waiting, 0.0, parallel=4, busy_background=0) == 2


def test_a_background_request_that_waited_long_enough_goes_first() -> None:
    waiting = [Q("background", queued_at=0.0), Q("interactive", queued_at=2 * AGING_S)]
    assert next_waiting(waiting, 2 * AGING_S - 1, parallel=4, busy_background=0) == 1
    assert next_waiting(waiting, 2 * AGING_S, parallel=4, busy_background=0) == 0  # equal rank: it came first


def test_background_requests_leave_the_last_slot_to_the_others() -> None:
    only_background = [Q("background")]
    assert next_waiting(only_background, 0.0, parallel=4, busy_background=3) is None
    assert next_waiting(only_background, 0.0, parallel=4, busy_background=2) == 0
    assert next_waiting([Q("background"), Q("normal")], 0.0, parallel=4, busy_background=3) == 1
    assert next_waiting(only_background, 0.0, parallel=1, busy_background=0) == 0  # one slot: it may have it


def test_background_pauses_while_interactive_runs_and_steps_once_per_bound() -> None:
    runs = [R("interactive"), R("background"), R("normal")]
    assert paused(runs, 0.0) == {1}
    assert paused(runs, MAX_PAUSE_S - 0.1) == {1}
    assert paused(runs, MAX_PAUSE_S) == set()  # its one step
    assert paused(runs, MAX_PAUSE_S + 0.1) == {1}  # paused again from there
    assert paused([R("background"), R("normal")], 0.0) == set()  # nothing interactive: nothing waits


def test_the_prefill_order_ranks_interactive_first() -> None:
    assert sorted(["background", "normal", "interactive"], key=by_rank) == ["interactive", "normal", "background"]


def test_a_background_prompt_goes_in_small_chunks() -> None:
    from workers.engines.llama.schedule import BACKGROUND_CHUNK, chunk_limit

    assert chunk_limit("background", 512) == BACKGROUND_CHUNK and chunk_limit("background", 40) == 40
    assert chunk_limit("interactive", 512) == 512 and chunk_limit("normal", 512) == 512
