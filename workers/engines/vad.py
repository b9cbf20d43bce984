"""Voice activity: Silero VAD v6 (ONNX) on onnxruntime's CPU provider, for server VAD.

The graph is the one faster-whisper's wheel carries (`faster_whisper/assets/silero_vad_v6.onnx`;
the `silero-vad` package would bring torch). Its input is a batch of windows, each 64 samples of
context (the end of the window before) and 512 new samples at 16 kHz; its LSTM runs over the
batch as a sequence, with `h` and `c` [1, 1, 128] going in and coming out. So one request's
windows run as one batch, and a clip sent whole gives what it gives sent in 20 ms pieces.

The worker keeps nothing between requests: what a stream needs next (h, c, the context, the
16 kHz samples that do not fill a window yet, and the resampler's carry) is packed into
`SpeechProbs.state`, and the gateway sends it back with the stream's next chunk.

Input other than 16 kHz is resampled to it by workers/engines/resample.py's `Resampler`, whose
carry fits in that state (FFmpeg's or soxr's resamplers keep theirs inside C).
"""

from __future__ import annotations

import os
import struct
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
import structlog

from protocol.wire import PROTOCOL_VERSION, VAD_WINDOW_MS, DetectSpeech, ErrorKind, Failed, Ready, SpeechProbs
from workers.engines import Emit, EngineError, EngineOptions
from workers.engines.resample import Resampler
from workers.engines.serial_jobs import SerialJobs

log = structlog.get_logger("worker.vad")

CPU = "CPUExecutionProvider"
MODEL_RATE = 16_000
WINDOW = MODEL_RATE * VAD_WINDOW_MS // 1000  # 512 samples
CONTEXT = 64  # samples of the window before that the graph reads with each window
HIDDEN = 128  # the LSTM's state size (h and c are [1, 1, 128])
RATES = (8_000, 16_000, 24_000, 48_000)  # 24 kHz: OpenAI Realtime's PCM
# One request's audio: a realtime client sends tens of milliseconds at a time; this bounds the
# batch (about 300 windows, a few milliseconds of compute) whatever a caller sends.
MAX_DETECT_SECONDS = 10

# State: this header, then float32 h, c, context, the pending 16 kHz samples, and the resampler's
# input carry (its length is fixed by the rate). The magic's last byte is the layout's version.
STATE_MAGIC = b"VAD\x01"
STATE_HEADER = struct.Struct("<4sIHI")  # magic, sample rate, pending samples, resampler position
F32 = np.dtype("<f4")


@dataclass
class Stream:
    """What one audio stream carries from one request to its next."""

    rate: int
    h: np.ndarray
    c: np.ndarray
    context: np.ndarray  # the last CONTEXT samples of the last window run
    pending: np.ndarray  # 16 kHz samples that do not fill a window yet
    history: np.ndarray  # the resampler's carry (empty at 16 kHz)
    position: int  # the resampler's (0 at 16 kHz)

    def pack(self) -> bytes:
        parts = (self.h, self.c, self.context, self.pending, self.history)
        return STATE_HEADER.pack(STATE_MAGIC, self.rate, len(self.pending), self.position) + b"".join(
            p.astype(F32).tobytes() for p in parts
        )


@dataclass
class Job:
    req: DetectSpeech
    stream: Stream
    audio: np.ndarray  # the request's samples at its own rate, in [-1, 1)
    started: float = field(default_factory=time.perf_counter)


class VadEngine(SerialJobs):
    name = "vad"
    serves = (DetectSpeech,)

    def __init__(self, opts: EngineOptions) -> None:
        t0 = time.perf_counter()
        self.path = Path(opts.model_path)
        if not self.path.is_file():
            raise EngineError(f"{self.path} does not exist: the VAD model is Silero VAD's ONNX graph",
                              kind=ErrorKind.ENGINE)  # fmt: skip
        so = ort.SessionOptions()
        # A few hundred windows a request take milliseconds on one core; more threads only contend
        # with the workers beside it.
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        self.session = ort.InferenceSession(str(self.path), sess_options=so, providers=[CPU])
        inputs = {i.name for i in self.session.get_inputs()}
        if inputs != {"input", "h", "c"}:
            raise EngineError(f"{self.path.name} is not Silero VAD v6's graph: its inputs are {sorted(inputs)}",
                              kind=ErrorKind.ENGINE)  # fmt: skip
        self.resamplers = {rate: Resampler(rate, MODEL_RATE) for rate in RATES if rate != MODEL_RATE}
        self.jobs: deque[Job] = deque()
        self.load_seconds = time.perf_counter() - t0
        log.info("vad model loaded", model=str(self.path), rates=list(RATES), seconds=round(self.load_seconds, 3))

    # ---- the stream's state -------------------------------------------------

    def new_stream(self, rate: int) -> Stream:
        history, position = self.resamplers[rate].start() if rate in self.resamplers else (np.zeros(0, F32), 0)
        zeros = np.zeros((1, 1, HIDDEN), dtype=np.float32)
        return Stream(rate, zeros, zeros.copy(), np.zeros(CONTEXT, F32), np.zeros(0, F32), history, position)

    def unpack(self, state: bytes, rate: int) -> Stream:
        """The stream `state` describes; EngineError when it is not one this engine wrote for `rate`."""
        if not state:
            return self.new_stream(rate)
        bad = "`state` is not a voice activity state this server made; start the stream again with an empty one"
        if len(state) < STATE_HEADER.size:
            raise EngineError(bad)
        magic, state_rate, n_pending, position = STATE_HEADER.unpack_from(state)
        if magic != STATE_MAGIC:
            raise EngineError(bad)
        if state_rate != rate:
            raise EngineError(f"`state` belongs to a stream at {state_rate} Hz, not {rate} Hz")
        resampler = self.resamplers.get(rate)
        n_history = resampler.taps - 1 if resampler else 0
        sizes = (HIDDEN, HIDDEN, CONTEXT, n_pending, n_history)
        if n_pending >= WINDOW or len(state) != STATE_HEADER.size + F32.itemsize * sum(sizes):
            raise EngineError(bad)
        if not (resampler.valid(position) if resampler else position == 0):
            raise EngineError(bad)
        values = np.frombuffer(state, dtype=F32, offset=STATE_HEADER.size)
        if not np.isfinite(values).all():
            raise EngineError(bad)
        h, c, context, pending, history = np.split(values, np.cumsum(sizes)[:-1])
        return Stream(rate, h.reshape(1, 1, HIDDEN), c.reshape(1, 1, HIDDEN), context, pending, history, position)

    # ---- one request --------------------------------------------------------

    def detect(self, job: Job) -> SpeechProbs:
        """Run the windows the request completes; the stream's state moves on past them."""
        s = job.stream
        audio = job.audio
        resampler = self.resamplers.get(s.rate)
        if resampler is not None:
            audio, s.history, s.position = resampler(audio, s.history, s.position)
        audio = np.concatenate([s.pending, audio])
        n = len(audio) // WINDOW
        windows = audio[: n * WINDOW].reshape(n, WINDOW)
        probs: list[float] = []
        if n:
            context = np.concatenate([s.context[None, :], windows[:-1, -CONTEXT:]])
            batch = np.ascontiguousarray(np.concatenate([context, windows], axis=1), dtype=np.float32)
            out, s.h, s.c = self.session.run(None, {"input": batch, "h": s.h, "c": s.c})
            probs = np.asarray(out, dtype=np.float64).reshape(-1).tolist()
            s.context = windows[-1, -CONTEXT:]
        s.pending = audio[n * WINDOW :]
        return SpeechProbs(job.req.req_id, probs, s.pack())

    # ---- Engine interface ---------------------------------------------------

    def ready(self) -> Ready:
        return Ready(
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            engine=self.name,
            compute="cpu",
            n_ctx=0,
            parallel=1,
            model_bytes=self.path.stat().st_size,
            load_seconds=round(self.load_seconds, 3),
            description=f"Silero VAD v6 voice activity, a probability per {VAD_WINDOW_MS} ms of 16 kHz audio "
            f"(input at {', '.join(str(r) for r in RATES)} Hz); onnxruntime on the CPU",
            provider=CPU,
        )

    def submit(self, req: DetectSpeech) -> None:
        if req.sample_rate not in RATES:
            raise EngineError(f"`sample_rate` must be one of {', '.join(str(r) for r in RATES)} Hz, "
                              f"got {req.sample_rate}")  # fmt: skip
        if len(req.pcm) % 2:
            raise EngineError(f"the audio is {len(req.pcm)} bytes: 16-bit PCM is an even number of bytes")
        if len(req.pcm) > 2 * req.sample_rate * MAX_DETECT_SECONDS:
            raise EngineError(f"the audio is {len(req.pcm) / (2 * req.sample_rate):.1f} s long: at most "
                              f"{MAX_DETECT_SECONDS} s a request; send the stream in shorter pieces")  # fmt: skip
        stream = self.unpack(req.state, req.sample_rate)
        audio = np.frombuffer(req.pcm, dtype="<i2").astype(np.float32) / 32768.0
        self.jobs.append(Job(req, stream, audio))

    def step(self, emit: Emit) -> None:
        job = self.jobs.popleft()
        try:
            answer = self.detect(job)
        except Exception as exc:  # one bad request fails, never the worker
            log.exception("voice activity detection failed", request_id=job.req.log_id)
            emit(Failed(job.req.req_id, ErrorKind.ENGINE, f"the model failed on this audio: {type(exc).__name__}"))
            return
        # Debug: a realtime stream sends a request every few tens of milliseconds.
        log.debug("speech detected", request_id=job.req.log_id, rate=job.stream.rate, samples=len(job.audio),
                  windows=len(answer.probs), seconds=round(time.perf_counter() - job.started, 4))  # fmt: skip
        emit(answer)

    def set_threads(self, n: int) -> None:
        pass  # one thread always


def load(opts: EngineOptions) -> VadEngine:
    return VadEngine(opts)
