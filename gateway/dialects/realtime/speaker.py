"""A response's voice: the sentences the chat model finishes, spoken by the session's Piper worker
one after another at the session's 24 kHz, each sent as `response.output_audio.delta` events as
soon as it is made, while the model goes on writing.

It keeps what it sent and when, so that an interrupted answer can be cut to what the listener
heard: a client plays the audio as it arrives, so by now it has heard at most the time since the
first delta, and never more than was sent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Awaitable, Callable

from gateway.http.services import Services
from gateway.ops.accounting import Accounting
from protocol.realtime import PCM_RATE
from protocol.wire import Audio, Done, Speak

BYTES_PER_MS = PCM_RATE * 2 // 1000
DELTA_MS = 200  # audio per delta event: small enough to start playing at once, few enough events


class Speaker:
    def __init__(self, services: Services, voice_model: str, voice: str, speed: float, log_id: str,
                 accounting: Accounting, send: Callable[[str], Awaitable[None]]) -> None:  # fmt: skip
        self.services = services
        self.voice_model = voice_model
        self.voice = voice
        self.speed = speed
        self.log_id = log_id
        self.accounting = accounting
        self.send = send  # sends one delta (base64 PCM)
        self.sentences: asyncio.Queue[str | None] = asyncio.Queue()
        self.sent_ms = 0.0
        self.first_at: float | None = None
        self.spoken: list[tuple[str, float]] = []  # each sentence and where its audio ends, in ms
        self.phonemes = 0
        self.task = asyncio.create_task(self._run())

    def say(self, sentence: str) -> None:
        self.sentences.put_nowait(sentence)

    async def finish(self) -> None:
        """Wait until everything said so far is sent; raise what stopped the voice."""
        self.sentences.put_nowait(None)
        await self.task
        self.accounting.settle("ok", self.phonemes, 0)

    async def stop(self) -> None:
        """Stop speaking now: the sentence in the worker is cancelled there."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task
        self.accounting.settle("cancelled", self.phonemes, 0)

    def heard_ms(self, now: float | None = None) -> int:
        if self.first_at is None:
            return 0
        played = ((now or time.monotonic()) - self.first_at) * 1000
        return int(min(self.sent_ms, played))

    def heard_text(self, ms: float) -> str:
        """The words whose audio ends by `ms`: whole sentences, then the share of the next one's
        words that its played share of audio holds."""
        kept: list[str] = []
        start = 0.0
        for sentence, end in self.spoken:
            if end <= ms:
                kept.append(sentence)
            else:
                words = sentence.split()
                share = max(0.0, (ms - start) / max(end - start, 1.0))
                if int(len(words) * share):
                    kept.append(" ".join(words[: int(len(words) * share)]))
                break
            start = end
        return " ".join(kept)

    async def _run(self) -> None:
        worker = None
        while (sentence := await self.sentences.get()) is not None:
            if worker is None:
                entry = self.services.store.resolve(self.voice_model)
                worker = await self.accounting.guard(self.services.worker(entry))
            stream = worker.speak(Speak(0, self.log_id, sentence, self.speed, voice=self.voice, sample_rate=PCM_RATE))
            try:
                async for msg in stream:
                    if isinstance(msg, Audio):
                        await self._deliver(msg.pcm)
                    elif isinstance(msg, Done):
                        self.phonemes += msg.prompt_tokens
            finally:
                await stream.aclose()  # type: ignore[attr-defined]  # cancelled mid-sentence: the worker stops it
            self.spoken.append((sentence, self.sent_ms))

    async def _deliver(self, pcm: bytes) -> None:
        step = DELTA_MS * BYTES_PER_MS
        for i in range(0, len(pcm), step):
            chunk = pcm[i : i + step]
            if self.first_at is None:
                self.first_at = time.monotonic()
                self.accounting.first_token()
            await self.send(base64.b64encode(chunk).decode("ascii"))
            self.sent_ms += len(chunk) / BYTES_PER_MS
