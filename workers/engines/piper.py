"""Text to speech with a Piper voice (a VITS graph in ONNX) on onnxruntime's CPU provider.

A voice is its `.onnx` graph and the `.onnx.json` beside it: the sample rate, the espeak-ng
voice for phonemes, the phoneme id map, and the default scales. `workers/engines/piper_text.py`
turns text into sentences of phoneme ids; each sentence is one pass of the graph, whose inputs
are `input` [1, n] ids, `input_lengths` [1], `scales` [noise_scale, length_scale, noise_w] and,
for a multi-speaker voice, `sid` [1]; its output is float audio in [-1, 1].

One step speaks one sentence of one request and emits it as an Audio message at once. Up to
`parallel` requests take turns a sentence each (so a long text does not hold up a short one);
the rest wait in order. A Cancel lands between sentences.

`speed` divides the voice's length scale (2.0: half the duration). With both noise settings at 0
the graph has no randomness left, so the same text gives the same samples every time.

A `sample_rate` other than the voice's own is reached with the VAD engine's numpy resampler (PyAV
comes with the `audio` extra, which a voice does not need), run across a request's sentences as one
stream; what its filter still holds at the end goes out as one last short Audio.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import psutil
import structlog

from protocol.speech import MAX_NOISE, MAX_SPEECH_CHARS, MAX_SPEED, MIN_SPEED
from protocol.wire import PROTOCOL_VERSION, Audio, Done, ErrorKind, Failed, FromWorker, Ready, Speak
from workers.engines import EngineError, EngineOptions
from workers.engines.piper_text import (
    BOS,
    EOS,
    PAD,
    Clause,
    Espeak,
    PhonemizerError,
    phoneme_ids,
    sentence_phonemes,
    split_sentences,
)
from workers.engines.resample import Resampler

log = structlog.get_logger("worker.piper")

CPU = "CPUExecutionProvider"
# The rates a request may ask its audio in (0: the voice's own).
MIN_RATE, MAX_RATE = 8_000, 48_000


@dataclass(frozen=True)
class Voice:
    """What a voice's .onnx.json says."""

    sample_rate: int
    espeak_voice: str
    id_map: dict[str, list[int]]
    phoneme_map: dict[str, list[str]]
    noise_scale: float
    length_scale: float
    noise_w: float
    speakers: dict[str, int]
    num_speakers: int
    language: str
    dataset: str
    quality: str


def voice_files(path: str) -> tuple[Path, Path]:
    """(graph, config) for a voice's .onnx file, or a folder holding one voice."""
    p = Path(path)
    if p.is_dir():
        graphs = sorted(g for g in p.glob("*.onnx") if g.with_name(g.name + ".json").is_file())
        if len(graphs) != 1:
            raise EngineError(f"{p} must hold exactly one Piper voice (.onnx with its .onnx.json), "
                              f"found {len(graphs)}", kind=ErrorKind.ENGINE)  # fmt: skip
        p = graphs[0]
    config = p.with_name(p.name + ".json")
    if not p.is_file() or not config.is_file():
        raise EngineError(f"a Piper voice needs {p.name} and {config.name} side by side", kind=ErrorKind.ENGINE)
    return p, config


def read_voice(config: Path) -> Voice:
    try:
        data: dict[str, Any] = json.loads(config.read_text())
        inference = data.get("inference", {})
        id_map = {str(k): [int(i) for i in v] for k, v in data["phoneme_id_map"].items()}
        voice = Voice(
            sample_rate=int(data["audio"]["sample_rate"]),
            espeak_voice=str(data.get("espeak", {}).get("voice", "en-us")),
            id_map=id_map,
            phoneme_map={str(k): [str(p) for p in v] for k, v in (data.get("phoneme_map") or {}).items()},
            noise_scale=float(inference.get("noise_scale", 0.667)),
            length_scale=float(inference.get("length_scale", 1.0)),
            noise_w=float(inference.get("noise_w", 0.8)),
            speakers={str(k): int(v) for k, v in (data.get("speaker_id_map") or {}).items()},
            num_speakers=int(data.get("num_speakers", 1)),
            language=str(data.get("language", {}).get("code", "")),
            dataset=str(data.get("dataset", "")),
            quality=str(data.get("audio", {}).get("quality", "")),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise EngineError(f"{config} is not a Piper voice config: {type(exc).__name__}: {exc}",
                          kind=ErrorKind.ENGINE) from None  # fmt: skip
    if data.get("phoneme_type", "espeak") != "espeak":
        raise EngineError(f"{config}: phoneme_type {data.get('phoneme_type')!r} is not supported (espeak only)",
                          kind=ErrorKind.ENGINE)  # fmt: skip
    missing = [s for s in (BOS, EOS, PAD) if s not in id_map]
    if missing:
        raise EngineError(f"{config}: phoneme_id_map lacks {missing}", kind=ErrorKind.ENGINE)
    return voice


def to_pcm16(audio: np.ndarray) -> bytes:
    """Float samples in [-1, 1] to 16-bit little-endian PCM (clipped, not rescaled, so every
    sentence keeps the loudness the voice gave it)."""
    scaled = np.clip(np.asarray(audio, dtype=np.float32).reshape(-1), -1.0, 1.0) * 32767.0
    return scaled.astype("<i2").tobytes()


@dataclass
class Job:
    req: Speak
    sentences: list[list[Clause]]
    scales: np.ndarray
    sid: int | None
    rate: int  # what its audio goes out at
    next: int = 0
    ids: int = 0  # phoneme ids read so far
    samples: int = 0  # put out, at the request's rate
    chunks: int = 0
    started: float = field(default_factory=time.perf_counter)
    resampler: Resampler | None = None  # to `rate`, when it is not the voice's
    history: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    position: int = 0  # the resampler's carry: `history`, `position`
    voice_samples: int = 0  # at the voice's rate, before resampling


class PiperEngine:
    name = "piper"
    serves = (Speak,)

    def __init__(self, opts: EngineOptions) -> None:
        t0 = time.perf_counter()
        self.graph, config = voice_files(opts.model_path)
        self.voice = read_voice(config)
        try:
            self.espeak = Espeak(self.voice.espeak_voice)
        except PhonemizerError as exc:
            raise EngineError(str(exc), kind=ErrorKind.ENGINE) from None
        self.threads = opts.threads or psutil.cpu_count(logical=False) or os.cpu_count() or 1
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        # Workers share the cores: a pool spinning between passes would slow the others down.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(self.graph), sess_options=so, providers=[CPU])
        self.inputs = {i.name for i in self.session.get_inputs()}
        if not {"input", "input_lengths", "scales"} <= self.inputs:
            raise EngineError(f"{self.graph.name} is not a Piper voice: its inputs are {sorted(self.inputs)}",
                              kind=ErrorKind.ENGINE)  # fmt: skip
        self.output = self.session.get_outputs()[0].name
        self.parallel = max(1, opts.parallel or 1)
        self.resamplers: dict[int, Resampler] = {}  # by the rate asked for
        self.active: deque[Job] = deque()
        self.waiting: deque[Job] = deque()
        # One sentence at load: espeak-ng and the voice are checked, and the first request does
        # not pay for onnxruntime's first run.
        self._speak_sentence(split_sentences("Ready.")[0], self.scales(1.0, 0.0, 0.0), None)
        self.load_seconds = time.perf_counter() - t0
        log.info("piper voice loaded", voice=str(self.graph), sample_rate=self.voice.sample_rate,
                 espeak_voice=self.voice.espeak_voice, speakers=self.voice.num_speakers,
                 seconds=round(self.load_seconds, 3))  # fmt: skip

    # ---- one sentence ---------------------------------------------------------

    def scales(self, speed: float, noise_scale: float, noise_w: float) -> np.ndarray:
        """The graph's `scales` input; a negative noise setting means the voice's own."""
        v = self.voice
        return np.array([v.noise_scale if noise_scale < 0 else noise_scale, v.length_scale / speed,
                         v.noise_w if noise_w < 0 else noise_w], dtype=np.float32)  # fmt: skip

    def sentence_ids(self, clauses: list[Clause]) -> list[int]:
        """One sentence's phoneme ids ([] when espeak finds nothing to say in it)."""
        try:
            lines = self.espeak.clause_lines(clauses)
        except PhonemizerError as exc:
            raise EngineError(str(exc), kind=ErrorKind.ENGINE) from None
        phonemes = sentence_phonemes(clauses, lines)
        if not phonemes.strip():
            return []
        ids, missing = phoneme_ids(phonemes, self.voice.id_map, self.voice.phoneme_map)
        if missing:
            log.debug("phonemes without an id left out", count=missing)
        return ids

    def synthesize(self, ids: list[int], scales: np.ndarray, sid: int | None) -> np.ndarray:
        """One pass of the graph: float32 samples."""
        x = np.array([ids], dtype=np.int64)
        feed = {"input": x, "input_lengths": np.array([x.shape[1]], dtype=np.int64), "scales": scales}
        if "sid" in self.inputs:
            feed["sid"] = np.array([sid or 0], dtype=np.int64)
        (audio,) = self.session.run([self.output], feed)
        return np.asarray(audio, dtype=np.float32).reshape(-1)

    def _speak_sentence(self, clauses: list[Clause], scales: np.ndarray, sid: int | None) -> tuple[np.ndarray, int]:
        """(samples, ids read) of one sentence."""
        ids = self.sentence_ids(clauses)
        if not ids:
            return np.zeros(0, dtype=np.float32), 0
        return self.synthesize(ids, scales, sid), len(ids)

    # ---- Engine interface ---------------------------------------------------------

    def ready(self) -> Ready:
        v = self.voice
        return Ready(
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            engine=self.name,
            compute="cpu",
            n_ctx=0,
            parallel=self.parallel,
            model_bytes=self.graph.stat().st_size,
            load_seconds=round(self.load_seconds, 3),
            description=f"Piper voice {self.graph.stem} ({v.language}, {v.quality}, {v.sample_rate} Hz, "
            f"{v.num_speakers} speaker{'s' if v.num_speakers != 1 else ''}); phonemes from espeak-ng "
            f"voice {v.espeak_voice}",
            provider=CPU,
        )

    def speaker(self, name: str) -> int | None:
        """The speaker id a request's `voice` names: any name for a one-speaker voice (it has no
        other), a name in speaker_id_map or a number below num_speakers for a multi-speaker one."""
        v = self.voice
        if v.num_speakers <= 1:
            return None
        if not name:
            return 0
        if name in v.speakers:
            return v.speakers[name]
        if name.isdigit() and int(name) < v.num_speakers:
            return int(name)
        known = ", ".join(sorted(v.speakers)[:20]) or f"0..{v.num_speakers - 1}"
        raise EngineError(f"`voice`: {name!r} is not a speaker of this voice; speakers: {known}")

    def submit(self, req: Speak) -> None:
        if not MIN_SPEED <= req.speed <= MAX_SPEED:
            raise EngineError(f"`speed` must be between {MIN_SPEED} and {MAX_SPEED}, got {req.speed}")
        if req.noise_scale > MAX_NOISE or req.noise_w > MAX_NOISE:
            raise EngineError(f"`noise_scale` and `noise_w` must be at most {MAX_NOISE}")
        if len(req.text) > MAX_SPEECH_CHARS:
            raise EngineError(f"`input` is {len(req.text)} characters; at most {MAX_SPEECH_CHARS}")
        if req.sample_rate and not MIN_RATE <= req.sample_rate <= MAX_RATE:
            raise EngineError(f"`sample_rate` must be between {MIN_RATE} and {MAX_RATE} Hz (0: the voice's own, "
                              f"{self.voice.sample_rate}), got {req.sample_rate}")  # fmt: skip
        rate = req.sample_rate or self.voice.sample_rate
        job = Job(req, split_sentences(req.text), self.scales(req.speed, req.noise_scale, req.noise_w),
                  self.speaker(req.voice), rate)  # fmt: skip
        if rate != self.voice.sample_rate:
            if rate not in self.resamplers:
                self.resamplers[rate] = Resampler(self.voice.sample_rate, rate)
            job.resampler = self.resamplers[rate]
            job.history, job.position = job.resampler.start()
        (self.active if len(self.active) < self.parallel else self.waiting).append(job)

    def has_work(self) -> bool:
        return bool(self.active)

    def step(self, emit: Callable[[FromWorker], None]) -> None:
        job = self.active[0]
        try:
            if job.next < len(job.sentences):
                audio, n_ids = self._speak_sentence(job.sentences[job.next], job.scales, job.sid)
                job.next += 1
                job.ids += n_ids
                self._emit_audio(job, self._to_rate(job, audio), emit)
            if job.next >= len(job.sentences) and job.resampler is not None:
                tail = job.resampler.flush(job.history, job.position, job.voice_samples, job.samples)
                self._emit_audio(job, tail, emit)
        except EngineError as exc:
            self._drop(job)
            emit(exc.failed(job.req.req_id))
            return
        except Exception as exc:  # one bad sentence fails its request, not the worker
            self._drop(job)
            log.exception("synthesis failed", request_id=job.req.log_id)
            emit(Failed(job.req.req_id, ErrorKind.ENGINE, f"the voice failed on this input: {type(exc).__name__}"))
            return
        if job.next >= len(job.sentences):
            if not job.chunks:  # nothing to say: one empty chunk still tells the sample rate
                emit(Audio(job.req.req_id, b"", job.rate))
            self._drop(job)
            seconds = job.samples / job.rate
            elapsed = time.perf_counter() - job.started
            log.info("spoken", request_id=job.req.log_id, sentences=len(job.sentences), ids=job.ids,
                     audio_s=round(seconds, 3), seconds=round(elapsed, 3),
                     rtf=round(elapsed / seconds, 3) if seconds else None)  # fmt: skip
            emit(Done(job.req.req_id, "stop", prompt_tokens=job.ids))
        else:
            self.active.rotate(-1)  # the next request's turn

    def _to_rate(self, job: Job, audio: np.ndarray) -> np.ndarray:
        """A sentence's samples at the rate the request asked for (its sentences as one stream)."""
        job.voice_samples += len(audio)
        if job.resampler is None:
            return audio
        out, job.history, job.position = job.resampler(audio, job.history, job.position)
        return out

    def _emit_audio(self, job: Job, audio: np.ndarray, emit: Callable[[FromWorker], None]) -> None:
        if not len(audio):
            return
        job.samples += len(audio)
        job.chunks += 1
        emit(Audio(job.req.req_id, to_pcm16(audio), job.rate))

    def _drop(self, job: Job) -> None:
        """Take a job out, and let a waiting one take its turn."""
        if job in self.active:
            self.active.remove(job)
        elif job in self.waiting:
            self.waiting.remove(job)
        while self.waiting and len(self.active) < self.parallel:
            self.active.append(self.waiting.popleft())

    def cancel(self, req_id: int, emit: Callable[[FromWorker], None]) -> None:
        for job in (*self.active, *self.waiting):
            if job.req.req_id == req_id:
                self._drop(job)
                emit(Done(req_id, "cancelled", prompt_tokens=job.ids))
                return

    def set_threads(self, n: int) -> None:
        pass  # onnxruntime fixes a session's threads when it is created; spinning is off instead

    def idle(self) -> None:
        pass

    def close(self) -> None:
        pass


def load(opts: EngineOptions) -> PiperEngine:
    return PiperEngine(opts)
