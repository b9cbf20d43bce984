"""`GET /v1/events`: the Server-Sent Events a client reads to follow model and worker state.

Each event's `data:` is one of these structs as JSON, told apart by `type`. The gateway's
supervisor publishes them (gateway/supervisor/events.py); the route sends a snapshot of the
workers first (one `worker` event each), then every change as it happens.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

# What a worker event's `state` says: the worker's lifecycle as a client follows it.
WORKER_STATES = ("loading", "ready", "idle", "busy", "hung", "stopping", "evicted", "crashed", "unloaded")


class WorkerChange(msgspec.Struct, tag="worker", tag_field="type", kw_only=True):
    """A worker of a model changed state (or, in the snapshot sent on connect, is in it)."""

    model: Annotated[str, Meta(description="the model's id, as /v1/models lists it")]
    worker: Annotated[str, Meta(description="the worker's name (its model, compute unit, nctx, and a hash of its key)")]
    state: Annotated[str, Meta(description="loading, ready, idle, busy, hung, stopping, evicted, crashed or unloaded")]
    pid: Annotated[int | None, Meta(description="the worker process's id (null before it is spawned)")]
    compute: Annotated[str, Meta(description="the unit the worker was started for: cpu, gpu, npu, hybrid, remote")]
    nctx: Annotated[int, Meta(description="the worker's context size, in tokens")]
    at: Annotated[float, Meta(description="when it happened, in seconds since the Unix epoch")]
    reason: Annotated[
        str | None,
        Meta(
            description="why a worker stopped: unload, idle, evicted, replaced, shutdown, failed to load, "
            "or a crashed worker's exit status"
        ),
    ] = None
    snapshot: Annotated[bool, Meta(description="true in the snapshot sent when the client connects")] = False


class Dropped(msgspec.Struct, tag="dropped", tag_field="type"):
    """This client read too slowly: `count` events were dropped (its oldest), so re-read /v1/models."""

    count: int


Event = WorkerChange | Dropped
