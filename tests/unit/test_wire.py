import msgspec
import pytest

from gateway.supervisor.states import State, can_move
from protocol.keys import WorkerKey
from protocol.wire import (
    Cancel,
    Delta,
    Done,
    Generate,
    Ready,
    Sampling,
    gateway_codec,
    worker_codec,
)


def test_round_trip_each_direction() -> None:
    g, w = gateway_codec(), worker_codec()
    msg = Generate(req_id=3, log_id="r", messages=[{"role": "user", "content": "x"}], stop=["a"],
                   sampling=Sampling(temperature=0, seed=5))  # fmt: skip
    assert w.decode(g.encode(msg)) == msg
    assert w.decode(g.encode(Cancel(3))) == Cancel(3)
    for reply in (
        Delta(3, "hi", 1),
        Done(3, "stop", 4, 1),
        Ready(protocol_version=1, pid=1, engine="e", compute="cpu", n_ctx=8),
    ):
        assert g.decode(w.encode(reply)) == reply


def test_a_gateway_message_is_not_a_valid_reply() -> None:
    with pytest.raises(msgspec.ValidationError):
        gateway_codec().decode(gateway_codec().encode(Cancel(1)))


def test_delta_is_compact() -> None:
    assert len(worker_codec().encode(Delta(12, "hello", 3))) < 16


def test_worker_key_slug_is_safe_and_distinct() -> None:
    a = WorkerKey("org/Some Model:Q4_0", "cpu", 4096)
    b = WorkerKey("org/Some Model:Q4_0", "cpu", 2048)
    assert a.slug != b.slug
    assert "/" not in a.slug and " " not in a.slug


def test_state_transitions() -> None:
    assert can_move(State.STARTING, State.READY)
    assert can_move(State.READY, State.FAILED)
    assert not can_move(State.STOPPED, State.READY)
    assert not can_move(State.READY, State.STARTING)
