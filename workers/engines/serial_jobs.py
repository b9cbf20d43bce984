"""The queue of an engine that works through one request at a time, in arrival order, a step of
the front job per loop turn (speech to text, diarization, voice activity): what cancelling, `has_work`,
`idle` and `close` mean there."""

from __future__ import annotations

from collections import deque
from typing import Any

from protocol.wire import Done
from workers.engines import Emit


class SerialJobs:
    jobs: deque[Any]  # each job holds its request as `.req`; the front one is in progress

    def cancel(self, req_id: int, emit: Emit) -> None:
        """Drop the job, queued or in progress: the next step starts on the next one."""
        for job in self.jobs:
            if job.req.req_id == req_id:
                self.jobs.remove(job)
                emit(Done(req_id, "cancelled"))
                return

    def has_work(self) -> bool:
        return bool(self.jobs)

    def idle(self) -> None:
        pass  # nothing to tidy between requests: a job holds all it uses

    def close(self) -> None:
        self.jobs.clear()
