"""A worker's lifecycle states and the one table of legal transitions."""

from __future__ import annotations

import enum


class State(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


_LEGAL: dict[State, frozenset[State]] = {
    State.STARTING: frozenset({State.READY, State.STOPPING, State.FAILED}),
    State.READY: frozenset({State.STOPPING, State.FAILED}),
    State.STOPPING: frozenset({State.STOPPED, State.FAILED}),
    State.STOPPED: frozenset(),
    State.FAILED: frozenset(),
}


def can_move(old: State, new: State) -> bool:
    return new in _LEGAL[old]


class IllegalTransition(RuntimeError):
    pass
