"""One request's bookkeeping: its metrics and its usage-ledger entry, settled exactly once.

Every endpoint that runs a model (chat, text completions, embeddings, reranking, logits) counts
through an `Accounting`, whichever way the request ends: answered, failed, or left by its client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from gateway.errors import ClientGone, DeadlineExceeded
from gateway.ops.energy import EnergyMeter, Share
from gateway.ops.metrics import RequestTimer

log = structlog.get_logger("gateway.accounting")

T = TypeVar("T")
Record = Callable[[int, int, float | None], None]  # (prompt_tokens, completion_tokens, energy_j) -> the ledger
CountEnergy = Callable[[str, float], None]  # (compute unit, joules) -> the metrics


def outcome_of(exc: BaseException) -> str:
    """How a request that raised is counted: the client left, or it failed."""
    # A request past its deadline is cancelled by the server, not failed by it.
    cancelled = (asyncio.CancelledError, GeneratorExit, ClientGone, DeadlineExceeded)
    return "cancelled" if isinstance(exc, cancelled) else "error"


def nothing_yet() -> tuple[int, int]:
    return 0, 0


class Accounting:
    def __init__(self, timer: RequestTimer, record: Record | None = None, energy: EnergyMeter | None = None,
                 count_energy: CountEnergy | None = None) -> None:  # fmt: skip
        self.timer = timer
        self.record = record
        self.settled = False
        self._energy = energy
        self._share: Share | None = None
        self._count_energy = count_energy
        self.compute = ""  # the unit its worker runs on, once it has one
        # Whether a request cut short is billed the tokens generated so far: true of a stream,
        # whose client got them; not of an answer sent whole at the end (relay.collect_events),
        # whose client got none of them.
        self.bills_partial = True

    def first_token(self) -> None:
        self.timer.first_token()

    def running(self) -> None:
        """Its worker admitted it: its share of the machine's energy counts from now."""
        if self._energy is not None and self._share is None and not self.settled:
            self._share = self._energy.begin()

    def energy_j(self) -> float | None:
        """Its energy, ended the first time it is asked (the answer is being shaped); None where the
        machine reports none, or the request never ran."""
        return self._share.end() if self._share is not None else None

    def settle(self, outcome: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> None:
        """Count the request once, in the metrics and the ledger; later calls are ignored.
        `cached_tokens`: the prompt tokens whose KV was reused rather than computed."""
        if self.settled:
            return
        self.settled = True
        # Read by the request's summary log line (same task, same context).
        structlog.contextvars.bind_contextvars(outcome=outcome, prompt_tokens=prompt_tokens,
                                               completion_tokens=completion_tokens)  # fmt: skip
        self.timer.finish(prompt_tokens, completion_tokens, outcome, cached_tokens)
        joules = self.energy_j()
        if joules is not None and self._count_energy is not None:
            self._count_energy(self.compute, joules)
        # The ledger bills what was answered: a finished request, or the tokens a cut-short stream got.
        if self.record is not None and (outcome == "ok" or (self.bills_partial and completion_tokens > 0)):
            try:
                self.record(prompt_tokens, completion_tokens, joules)
            except Exception as exc:  # noqa: BLE001 - accounting must never break an answer already produced
                log.error("usage not recorded", error=repr(exc))

    async def guard(self, work: Awaitable[T], so_far: Callable[[], tuple[int, int]] = nothing_yet) -> T:
        """Await `work`; if it raises, settle as failed or cancelled with the tokens `so_far`, then re-raise."""
        try:
            return await work
        except BaseException as exc:
            self.settle(outcome_of(exc), *so_far())
            raise
