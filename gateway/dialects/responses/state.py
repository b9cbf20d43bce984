"""The room's long-lived state: the store of responses and conversations, and the background
responses running; opened and closed by the app's lifespan (gateway/app.py mounts it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from gateway.dialects.responses.background import Jobs
from gateway.dialects.responses.store import FILE, Limits, ResponseStore
from gateway.http.lifecycle import Lifecycle
from gateway.ops.settings import Settings


class ResponsesState:
    def __init__(self, settings: Settings, lifecycle: Lifecycle, in_memory: bool = False) -> None:
        limits = Limits(responses=settings.responses_store_max, response_bytes=settings.responses_store_mb << 20,
                        conversations=settings.conversations_store_max,
                        conversation_bytes=settings.conversations_store_mb << 20)  # fmt: skip
        self.lifecycle = lifecycle
        self.store = ResponseStore(None if in_memory else settings.data_dir / FILE, limits)
        self.jobs = Jobs(lifecycle, settings.responses_background_per_key, settings.responses_background_max,
                         settings.responses_events_mb << 20, settings.drain_timeout_s)  # fmt: skip

    @asynccontextmanager
    async def lifespan(self, _app: Any) -> AsyncIterator[None]:
        await self.store.open()  # what a stopped server left unfinished is marked failed
        # Before the pool's abort of everything in flight, so that these end cancelled, saying why.
        self.lifecycle.on_drain_timeout.insert(0, self.jobs.drain_timed_out)
        try:
            yield
        finally:
            await self.jobs.close()
            await self.store.close()
