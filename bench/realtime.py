"""`/v1/realtime` (OpenAI's Realtime API over a WebSocket) end to end, with real models, against
the same steps done the plain HTTP way, in the same run, on the same server.

    .venv/bin/python bench/realtime.py [--runs 5] [--busy 1] [--low-silence-ms 200]

The server is started as a user starts it (bench/launcher.py, an empty data dir): the chat model
SmolLM2-135M (Q4_1), Whisper tiny.en, the Piper voice joe and Silero VAD, the ones it bundles. The
client is the `openai` SDK: `client.realtime.connect(model=...)` for the sessions, the HTTP
resources for the baseline. The spoken question is Piper's own "What is the capital of France?"
(made once through /v1/audio/speech with noise 0, resampled to 24 kHz), trimmed to its voiced
part (10 ms frames within 40 dB of the loudest), after enough silence (at least 500 ms) that
the speech ends exactly at the end of a 100 ms chunk.

**End of speech.** The clip is appended in real time, 100 ms chunks every 100 ms on a fixed
schedule (as a microphone delivers it: a chunk goes when its last sample is recorded), so the
wall clock at which the chunk holding the last speech sample was sent is known: that instant is
the end of speech, t=0 of every figure. After it the client goes on appending silence (digital
zeros) in real time, as an open microphone would, until `response.done`.

**Latency** (a short answer: instructions "Answer in one short sentence." and `max_output_tokens`
10, so that the sampled answer is "The capital of France is Paris." or as long, cut, whichever the
model says), each turn in a fresh session so that every turn's prompt is the same, split into
stages:

- VAD: end of speech -> `input_audio_buffer.speech_stopped`. The server waits for
  `silence_duration_ms` of silence by design (500 by default), so this stage holds it; it is
  measured with the default and with `--low-silence-ms` (200). Also reported: where the VAD put
  the end (`audio_end_ms`) against the true end in the stream.
- transcribe: `speech_stopped` (push-to-talk: end of speech) -> `conversation.item.input_audio_
  transcription.completed` (Whisper on the committed turn).
- TTFT: transcription completed -> the first `response.output_audio_transcript.delta` (the chat
  model's first token, as text).
- 1st sentence: the first transcript delta -> the first `response.output_audio.delta` (the rest of
  the first sentence written, Piper speaking it, the first 200 ms of it sent).
- total: end of speech -> the first audio byte of the answer.

Four ways, in an order that rotates every run, after one untimed warm-up turn of each:

- `realtime, VAD 500 ms`: server VAD as OpenAI's default has it;
- `realtime, VAD <low> ms`: the same with `silence_duration_ms` lowered;
- `realtime, push-to-talk`: `turn_detection: null`; at the end of speech the client sends
  `input_audio_buffer.commit` and `response.create` (no VAD stage);
- `HTTP`: the plain way, from the end of speech: `POST /v1/audio/transcriptions` of the same
  clip (the 24 kHz WAV of what push-to-talk commits), a streamed `/v1/chat/completions` of the
  same messages (the instructions as the system turn, the transcript as the user's) with the same
  `max_completion_tokens`, cut into sentences as the session cuts them
  (gateway/dialects/realtime/sentences.py), and each sentence, as soon as it is complete, spoken by
  `POST /v1/audio/speech` (`stream_format: sse`, one request after the other); its stages are
  the transcription request, the chat request to its first token, and the first token to the
  first audio delta of the first sentence.

**Real-time factor of the chain** (a longer answer: the clip "Tell me a story about a dragon.",
made and cut as the first, instructions "You are a storyteller. Tell a story of a few short
sentences.", `max_output_tokens` 96, which SmolLM2 uses up: about 20 s of speech in 4 to 6
sentences; server VAD at its default 500 ms), one session alone and two sessions at once (both
speak the clip at the same instant, the worst case), and the HTTP way alike. The realtime API has
no temperature, so the chat model samples at its default in both ways: the answers, and the length
of their first sentence, differ from turn to turn. Per session:

- first audio: end of speech -> the first audio byte; 1st sent.: the seconds of audio the first
  sentence holds (what the 1st sentence stage made); done: end of speech -> `response.done`
  (HTTP: the last sentence's audio received);
- audio: the seconds of speech the answer holds (the audio deltas' samples / their rate);
- RTF = done / audio: seconds of work from the end of speech per second of answer (below 1: the
  whole answer is ready before a listener who started at the end of speech could hear it all);
- RTF after first audio = (done - first audio) / audio: the speech's production rate once it
  has started, against playback (below 1: it outruns the listener);
- stall: the silence a listener hears inside the answer, playing each delta as it comes from the
  first one on (0: never waits for audio once the answer has started).

CPU seconds per turn (psutil) of the gateway, of the workers together (VAD, Whisper, chat,
Piper), and of this client. The realtime turns run longer at the client (the clip is streamed in
real time, and the VAD reads the open microphone until `response.done`), so their worker CPU
holds the VAD's reading of the input that the HTTP way never does.

With `--busy N` (default 1) it all runs again with N spinning processes beside the server
(bench/contention.py's neighbour; 0: no busy phase). Every turn, every event time included, goes
to `--json` (default bench/results/realtime.json). Any `error` event, failed response or turn
that timed out is counted and printed: the report says so rather than hide it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import functools
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import wave
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder comes first on the path, and this file would shadow any `realtime` module.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx
import numpy as np
import openai
import psutil

from bench.contention import Hogs
from bench.launcher import Server
from bench.stats import pct
from gateway.dialects.realtime.sentences import Sentences
from tests.speech import WHISPER_MODEL, wav_bytes

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1"  # tests/conftest.py's MODEL
VOICE = "rhasspy/piper-en_US-joe:medium"
QUESTION = "What is the capital of France?"
SHORT = "Answer in one short sentence."
STORY = "Tell me a story about a dragon."
LONG = "You are a storyteller. Tell a story of a few short sentences."
RATE = 24_000  # the Realtime API's PCM
CHUNK = RATE // 10  # samples per append: 100 ms
LEAD_MS = 500  # silence before the speech, at least

Turn = dict[str, Any]
TIMES = ("vad_s", "transcribe_s", "ttft_s", "first_sentence_s", "first_audio_s", "done_s", "stall_s",
         "first_sentence_audio_s", "vad_end_vs_true_ms")  # fmt: skip


# ---- the spoken question --------------------------------------------------------------------------


def utterance(base: str, text: str) -> tuple[bytes, int]:
    """(24 kHz PCM of silence then `text` spoken, ending at a chunk boundary; ms of speech)."""
    r = httpx.post(f"{base}/v1/audio/speech", json={"model": VOICE, "input": text, "noise_scale": 0, "noise_w": 0},
                   timeout=600)  # fmt: skip
    r.raise_for_status()
    with wave.open(io.BytesIO(r.content)) as w:
        rate, x = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float64)
    y = np.interp(np.arange(int(len(x) * RATE / rate)) * rate / RATE, np.arange(len(x)), x)
    frame = RATE // 100
    rms = np.sqrt((y[: len(y) // frame * frame].reshape(-1, frame) ** 2).mean(axis=1))
    voiced = np.nonzero(rms > rms.max() * 0.01)[0]  # within 40 dB of the loudest 10 ms
    speech = y[voiced[0] * frame : (voiced[-1] + 1) * frame]
    lead = LEAD_MS * RATE // 1000
    lead += -(lead + len(speech)) % CHUNK
    pcm = np.concatenate([np.zeros(lead), speech]).round().clip(-32768, 32767).astype("<i2")
    return pcm.tobytes(), len(speech) * 1000 // RATE


# ---- measuring ------------------------------------------------------------------------------------


def closed_sessions(log: str) -> set[str]:
    """The ids of the sessions the server's log says closed."""
    out = set()
    for line in log.splitlines():
        if '"event": "realtime session closed"' in line:
            try:
                out.add(json.loads(line).get("request_id", ""))
            except ValueError:
                pass
    return out


def sessions_left_open(log: str) -> tuple[int, int, int]:
    """(opened, closed, refused) realtime sessions, from the server's log.

    Every session here ends with its client leaving, so each should log "realtime session closed".
    A first version of this bench found sessions that never did: on Python 3.11, asyncio.wait_for
    (then in WorkerHandle.call) returned a VAD answer and dropped the close()'s cancellation that
    met it in one loop turn, the VAD loop went back to waiting for audio, and the session's slot of
    --realtime-sessions-per-key was never given back. The server runs with the default limit (4),
    so a leak shows here as refused sessions too."""
    count: collections.Counter[str] = collections.Counter()
    for line in log.splitlines():
        for what in ("opened", "closed", "refused"):
            if f'"event": "realtime session {what}"' in line:
                count[what] += 1
    return count["opened"], count["closed"], count["refused"]


def stall_s(deltas: list[tuple[float, float]]) -> float | None:
    """Silence inside the answer for a listener who plays each delta as it comes, from the first."""
    if not deltas:
        return None
    play, stalled = deltas[0][0], 0.0
    for at, seconds in deltas:
        if at > play:
            stalled, play = stalled + at - play, at
        play += seconds
    return stalled


def burst_s(deltas: list[tuple[float, float]]) -> float | None:
    """The audio of the first sentence: the session sends a sentence's deltas at once, so the
    deltas up to the first gap of 50 ms."""
    if not deltas:
        return None
    seconds, last = 0.0, deltas[0][0]
    for at, s in deltas:
        if at - last > 0.05:
            break
        seconds, last = seconds + s, at
    return seconds


class ServerCPU:
    """CPU seconds (user + system) of the gateway and of its workers together."""

    def __init__(self, pid: int) -> None:
        self.gateway = psutil.Process(pid)

    def read(self) -> tuple[float, float]:
        def cpu(p: psutil.Process) -> float:
            try:
                t = p.cpu_times()
                return t.user + t.system
            except psutil.Error:
                return 0.0

        return cpu(self.gateway), sum(cpu(c) for c in self.gateway.children(recursive=True))


def since(t0: float, t: float | None) -> float | None:
    return None if t is None else t - t0


# ---- one turn, the realtime way -------------------------------------------------------------------


async def realtime_turn(client: openai.AsyncOpenAI, pcm: bytes, speech_end_ms: int, silence_ms: int | None,
                        instructions: str, max_tokens: int, timeout: float) -> Turn:  # fmt: skip
    """One spoken question and its answer in a fresh session; `silence_ms` None: push-to-talk."""
    chunks = [base64.b64encode(pcm[i : i + CHUNK * 2]).decode() for i in range(0, len(pcm), CHUNK * 2)]
    silence = base64.b64encode(bytes(CHUNK * 2)).decode()
    events: list[tuple[float, str, Any]] = []
    done = asyncio.Event()
    turn: Turn = {"errors": [], "timed_out": False}
    async with client.realtime.connect(model=MODEL) as conn:
        first = await conn.recv()
        turn["session_id"] = getattr(first.session, "id", None) if first.type == "session.created" else None
        if first.type != "session.created":  # e.g. an `error` event: the server refused the session
            turn["errors"].append(first.model_dump(exclude_none=True))
            return {**turn, **dict.fromkeys(TIMES), "audio_s": 0.0, "status": None, "output_tokens": None,
                    "cached_tokens": None, "answer": None}  # fmt: skip
        detection: Any = None if silence_ms is None else {"type": "server_vad", "silence_duration_ms": silence_ms}
        await conn.session.update(session={"type": "realtime", "instructions": instructions,
                                           "max_output_tokens": max_tokens,
                                           "audio": {"input": {"transcription": {"model": "whisper-1"},
                                                               "turn_detection": detection}}})  # fmt: skip
        updated = await conn.recv()
        if updated.type != "session.updated":
            raise RuntimeError(f"session.update answered {updated.type}: {updated}")

        async def receive() -> None:
            async for ev in conn:
                events.append((time.perf_counter(), ev.type, ev))
                if ev.type == "error":
                    turn["errors"].append(ev.error.model_dump(exclude_none=True))
                elif ev.type == "response.done":
                    done.set()
                    return

        rx = asyncio.create_task(receive())
        t0 = time.perf_counter()
        t_end = t0 + len(chunks) * 0.1  # replaced by the real send time below
        i = 0
        while i < len(chunks) or (silence_ms is not None and not done.is_set() and not rx.done()):
            await asyncio.sleep(max(0.0, t0 + i * 0.1 - time.perf_counter()))
            await conn.input_audio_buffer.append(audio=chunks[i] if i < len(chunks) else silence)
            if i == len(chunks) - 1:
                t_end = time.perf_counter()
            elif i >= len(chunks) and time.perf_counter() - t_end > timeout:
                turn["timed_out"] = True
                break
            i += 1
        if silence_ms is None:
            await conn.input_audio_buffer.commit()
            await conn.response.create()
        try:
            await asyncio.wait_for(done.wait(), max(1.0, timeout - (time.perf_counter() - t_end)))
        except TimeoutError:
            turn["timed_out"] = True
        rx.cancel()
        await asyncio.gather(rx, return_exceptions=True)

    def at(kind: str) -> float | None:
        return next((t for t, k, _ in events if k == kind), None)

    def ev(kind: str) -> Any:
        return next((e for _, k, e in events if k == kind), None)

    stopped, transcribed = (
        at("input_audio_buffer.speech_stopped"),
        at("conversation.item.input_audio_transcription.completed"),
    )
    first_text, first_audio = at("response.output_audio_transcript.delta"), at("response.output_audio.delta")
    deltas = [
        (t, len(base64.b64decode(e.delta)) / 2 / RATE) for t, k, e in events if k == "response.output_audio.delta"
    ]
    heard = transcribed is not None
    heard_from = stopped if silence_ms is not None else t_end
    resp = ev("response.done")
    usage = resp.response.usage if resp is not None else None
    turn.update({
        "first_sentence_audio_s": burst_s(deltas),
        "vad_s": since(t_end, stopped) if silence_ms is not None else None,
        "transcribe_s": since(heard_from, transcribed) if heard_from is not None and heard else None,
        "ttft_s": since(transcribed, first_text) if transcribed is not None else None,
        "first_sentence_s": since(first_text, first_audio) if first_text is not None else None,
        "first_audio_s": since(t_end, first_audio),
        "done_s": since(t_end, at("response.done")),
        "audio_s": sum(s for _, s in deltas),
        "stall_s": stall_s(deltas),
        "vad_end_vs_true_ms": (ev("input_audio_buffer.speech_stopped").audio_end_ms - speech_end_ms) if stopped else None,
        "transcript": ev("conversation.item.input_audio_transcription.completed").transcript if heard else None,
        "answer": (e.transcript if (e := ev("response.output_audio_transcript.done")) is not None else None),
        "status": resp.response.status if resp is not None else None,
        "output_tokens": usage.output_tokens if usage is not None else None,
        "cached_tokens": usage.input_token_details.cached_tokens if usage is not None and usage.input_token_details else None,
        "events": [(round(t - t_end, 4), k) for t, k, _ in events if k != "response.output_audio.delta"],
        "audio_deltas": [(round(t - t_end, 4), round(s, 3)) for t, s in deltas],
    })  # fmt: skip
    return turn


# ---- one turn, the plain HTTP way -----------------------------------------------------------------


async def http_turn(client: openai.AsyncOpenAI, http: httpx.AsyncClient, base: str, wav: bytes, instructions: str,
                    max_tokens: int, timeout: float) -> Turn:  # fmt: skip
    """Transcribe, stream the chat, speak each sentence as it is complete: the same chain by hand."""
    deltas: list[tuple[float, float]] = []
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    turn: Turn = {"errors": [], "timed_out": False}

    async def speak() -> None:
        while (sentence := await queue.get()) is not None:
            body = {"model": VOICE, "input": sentence, "stream_format": "sse"}
            async with http.stream("POST", f"{base}/v1/audio/speech", json=body) as r:
                r.raise_for_status()
                rate = int(r.headers.get("GenieX-Sample-Rate", "22050"))
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        event = json.loads(line[6:])
                        if event.get("type") == "speech.audio.delta":
                            deltas.append((time.perf_counter(), len(base64.b64decode(event["audio"])) / 2 / rate))
                        elif "error" in event:
                            turn["errors"].append(event)

    async def chain() -> None:
        tr = await client.audio.transcriptions.create(
            model=WHISPER_MODEL, file=("clip.wav", wav), response_format="json"
        )
        turn["t_transcribed"] = time.perf_counter()
        turn["transcript"] = text = tr.text.strip()
        sentences, answer, usage = Sentences(), "", None
        speaker = asyncio.create_task(speak())
        try:
            turn["t_chat"] = time.perf_counter()
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "system", "content": instructions}, {"role": "user", "content": text}],
                max_completion_tokens=max_tokens, stream=True, stream_options={"include_usage": True},
            )  # fmt: skip
            async for chunk in stream:
                usage = chunk.usage or usage
                for c in chunk.choices:
                    if c.delta is not None and c.delta.content:
                        turn.setdefault("t_first_token", time.perf_counter())
                        answer += c.delta.content
                        for s in sentences.feed(c.delta.content):
                            queue.put_nowait(s)
            if tail := sentences.rest():
                queue.put_nowait(tail)
            queue.put_nowait(None)
            await speaker
        finally:
            speaker.cancel()
        turn["answer"], turn["usage"] = answer, usage

    t_end = time.perf_counter()
    try:
        await asyncio.wait_for(chain(), timeout)
        turn["status"] = "failed" if turn["errors"] else "completed"
    except TimeoutError:
        turn["timed_out"] = True
    except (openai.APIError, httpx.HTTPError) as exc:
        turn["errors"].append(repr(exc))
        turn["status"] = "failed"
    t_done = time.perf_counter()
    usage = turn.pop("usage", None)
    t_tr, t_chat, t_tok = turn.pop("t_transcribed", None), turn.pop("t_chat", None), turn.pop("t_first_token", None)
    first_audio = deltas[0][0] if deltas else None
    details = usage.prompt_tokens_details if usage is not None else None
    turn.update({
        "first_sentence_audio_s": deltas[0][1] if deltas else None,  # one SSE delta per sentence
        "vad_s": None,
        "transcribe_s": since(t_end, t_tr),
        "ttft_s": since(t_chat, t_tok) if t_chat is not None else None,
        "first_sentence_s": since(t_tok, first_audio) if t_tok is not None else None,
        "first_audio_s": since(t_end, first_audio),
        "done_s": t_done - t_end if not turn["timed_out"] else None,
        "audio_s": sum(s for _, s in deltas),
        "stall_s": stall_s(deltas),
        "output_tokens": usage.completion_tokens if usage is not None else None,
        "cached_tokens": details.cached_tokens if details is not None else None,
        "audio_deltas": [(round(t - t_end, 4), round(s, 3)) for t, s in deltas],
    })  # fmt: skip
    return turn


# ---- the runs -----------------------------------------------------------------------------------


class Bench:
    def __init__(self, srv: Server, args: argparse.Namespace, clips: dict[str, bytes]) -> None:
        self.srv, self.args, self.clips = srv, args, clips
        self.client = openai.AsyncOpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=600)
        self.http = httpx.AsyncClient(timeout=600)
        self.cpu = ServerCPU(srv.proc.pid)

    def way(self, name: str, clip: str, instructions: str, max_tokens: int) -> Callable[[], Awaitable[Turn]]:
        a, pcm = self.args, self.clips[clip]
        if name == "http":
            wav = wav_bytes(np.frombuffer(pcm, dtype="<i2"), RATE)
            return lambda: http_turn(self.client, self.http, self.srv.base_url, wav, instructions, max_tokens,
                                     a.timeout)  # fmt: skip
        silence = None if name == "ptt" else int(name.removeprefix("vad"))
        end_ms = len(pcm) // 2 * 1000 // RATE
        return lambda: realtime_turn(self.client, pcm, end_ms, silence, instructions, max_tokens, a.timeout)

    async def timed(self, sessions: list[Callable[[], Awaitable[Turn]]]) -> list[Turn]:
        """The sessions at once; each turn carries the CPU seconds of the whole scenario."""
        gw0, wk0 = self.cpu.read()
        c0 = time.process_time()
        turns = list(await asyncio.gather(*(s() for s in sessions)))
        gw1, wk1 = self.cpu.read()
        for t in turns:
            t.update(gateway_cpu_s=gw1 - gw0, workers_cpu_s=wk1 - wk0, client_cpu_s=time.process_time() - c0)
        return turns

    async def latency(self, label: str) -> dict[str, list[Turn]]:
        names = ["vad500", f"vad{self.args.low_silence_ms}", "ptt", "http"]
        ways = {n: self.way(n, QUESTION, SHORT, self.args.max_output_tokens) for n in names}
        for n in names:  # warm-up, untimed
            await ways[n]()
        got: dict[str, list[Turn]] = {n: [] for n in names}
        for i in range(self.args.runs):
            for n in names[i % len(names) :] + names[: i % len(names)]:
                (turn,) = await self.timed([ways[n]])
                got[n].append(turn)
                note(label, n, i, turn)
        return got

    async def rtf(self, label: str) -> dict[str, list[Turn]]:
        scenarios = {f"{w} x{k}": [self.way(w, STORY, LONG, self.args.long_max_output_tokens)] * k
                     for w in ("vad500", "http") for k in (1, 2)}  # fmt: skip
        names = list(scenarios)
        for w in ("vad500 x1", "http x1"):  # warm-up of the long answer, untimed
            await self.timed(scenarios[w])
        got: dict[str, list[Turn]] = {n: [] for n in names}
        for i in range(self.args.runs):
            for n in names[i % len(names) :] + names[: i % len(names)]:
                for turn in await self.timed(scenarios[n]):
                    got[n].append(turn)
                    note(label, n, i, turn)
        return got


def note(label: str, name: str, i: int, t: Turn) -> None:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    problems = ("; ERRORS " + json.dumps(t["errors"], default=str)) if t["errors"] else ""
    problems += "; TIMED OUT" if t["timed_out"] else ""
    if t.get("status") not in (None, "completed"):
        problems += f"; status {t.get('status')}"
    print(f"{label} {name} run {i + 1}: vad {f(t['vad_s'])} transcribe {f(t['transcribe_s'])} ttft {f(t['ttft_s'])} "
          f"1st sentence {f(t['first_sentence_s'])} first audio {f(t['first_audio_s'])} done {f(t['done_s'])} "
          f"audio {t['audio_s']:.2f} s, {t.get('output_tokens')} tokens: {t.get('answer')!r}{problems}", flush=True)  # fmt: skip


# ---- the report --------------------------------------------------------------------------------


def mp(values: list[float | None], scale: float = 1.0, digits: int = 2) -> str:
    xs = [v * scale for v in values if v is not None]
    if not xs:
        return "-"
    return f"{statistics.median(xs):.{digits}f} / {pct(xs, 90):.{digits}f}"


def med_of(values: list[float | None]) -> str:
    xs = [v for v in values if v is not None]
    return f"{statistics.median(xs):g}" if xs else "-"


def column(turns: list[Turn], key: str) -> list[Any]:
    return [t[key] for t in turns]


def label_of(name: str) -> str:
    if name.startswith("http"):
        return "HTTP: transcribe, chat, speech" + name.removeprefix("http")
    if name.startswith("ptt"):
        return "realtime, push-to-talk"
    ms, _, k = name.removeprefix("vad").partition(" ")
    return f"realtime, VAD {ms} ms" + (f" {k}" if k else "")


def report(label: str, lat: dict[str, list[Turn]], rtf: dict[str, list[Turn]], runs: int) -> None:
    print(f"\n== {label}: end of speech -> first audio byte, seconds, median / p90 of {runs} runs ==")
    print(f"{'':32s} {'VAD':>13s} {'transcribe':>13s} {'TTFT':>13s} {'1st sentence':>13s} {'total':>13s} "
          f"{'tokens':>6s} {'its audio s':>11s} {'gw CPU ms':>11s} {'workers CPU s':>13s}")  # fmt: skip
    for name, turns in lat.items():
        col = functools.partial(column, turns)
        print(f"{label_of(name):32s} {mp(col('vad_s')):>13s} {mp(col('transcribe_s')):>13s} {mp(col('ttft_s')):>13s} "
              f"{mp(col('first_sentence_s')):>13s} {mp(col('first_audio_s')):>13s} {med_of(col('output_tokens')):>6s} "
              f"{mp(col('first_sentence_audio_s'), 1, 1):>11s} {mp(col('gateway_cpu_s'), 1000, 0):>11s} {mp(col('workers_cpu_s')):>13s}")  # fmt: skip
    for name, turns in lat.items():
        if name.startswith("vad"):
            ends = [t["vad_end_vs_true_ms"] for t in turns if t["vad_end_vs_true_ms"] is not None]
            print(f"  {label_of(name)}: VAD's audio_end_ms - true end of speech: {ends} ms")
    print(f"\n== {label}: the chain's real-time factor, a longer answer; median / p90 over sessions ==")
    print(f"{'':36s} {'first audio s':>13s} {'1st sent. s':>13s} {'done s':>13s} {'audio s':>13s} {'RTF':>13s} "
          f"{'RTF after 1st':>13s} {'stall s':>13s} {'tokens':>8s}")  # fmt: skip
    for name, turns in rtf.items():
        col = functools.partial(column, turns)
        after = [(t["done_s"] - t["first_audio_s"]) / t["audio_s"] if t["done_s"] is not None and
                 t["first_audio_s"] is not None and t["audio_s"] else None for t in turns]  # fmt: skip
        ratio = [t["done_s"] / t["audio_s"] if t["done_s"] is not None and t["audio_s"] else None for t in turns]
        toks = [t["output_tokens"] for t in turns if t["output_tokens"] is not None]
        print(f"{label_of(name):36s} {mp(col('first_audio_s')):>13s} {mp(col('first_sentence_audio_s')):>13s} "
              f"{mp(col('done_s')):>13s} "
              f"{mp(col('audio_s')):>13s} {mp(ratio):>13s} {mp(after):>13s} {mp(col('stall_s')):>13s} "
              f"{med_of(toks):>8s}")  # fmt: skip
    # "incomplete" is an answer cut at max_output_tokens, as the long answers are meant to be.
    bad = [(n, i, t) for d in (lat, rtf) for n, ts in d.items() for i, t in enumerate(ts)
           if t["errors"] or t["timed_out"] or t.get("status") not in ("completed", "incomplete")]  # fmt: skip
    statuses = collections.Counter(str(t.get("status")) for d in (lat, rtf) for ts in d.values() for t in ts)
    transcripts = {t.get("transcript") for d in (lat, rtf) for ts in d.values() for t in ts}
    cached = sorted({t["cached_tokens"] for ts in lat.values() for t in ts if t["cached_tokens"] is not None})
    print(f"transcripts: {sorted(transcripts, key=str)}; cached prompt tokens seen (latency turns): {cached}")
    print(f"response statuses: {dict(statuses)}; turns with an error event, a failed response or a timeout: {len(bad)}")
    for n, i, t in bad:
        print(f"  {n} #{i + 1}: status {t.get('status')}, timed out {t['timed_out']}, errors {t['errors']}")


async def run_all(srv: Server, args: argparse.Namespace, clips: dict[str, bytes]) -> dict[str, Any]:
    bench = Bench(srv, args, clips)
    out: dict[str, Any] = {}
    phases = [("idle", 0)] + ([(f"busy {args.busy}", args.busy)] if args.busy else [])
    try:
        for label, busy in phases:
            load0 = os.getloadavg()[0]
            with Hogs(busy):
                lat = await bench.latency(label)
                rtf = await bench.rtf(label)
            out[label] = {"latency": lat, "rtf": rtf, "load_before": load0, "load_after": os.getloadavg()[0]}
    finally:
        await bench.http.aclose()
        await bench.client.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "--runs", type=int, default=5, help="timed turns per way and scenario, after one warm-up (default 5)"
    )
    p.add_argument("--low-silence-ms", type=int, default=200, help="the lowered silence_duration_ms (default 200)")
    p.add_argument("--max-output-tokens", type=int, default=10, help="the short answer's cap (default 10)")
    p.add_argument(
        "--long-max-output-tokens", type=int, default=96, help="the real-time factor's answer cap (default 96)"
    )
    p.add_argument("--busy", type=int, default=1, help="spinning processes in the second phase (0: no busy phase)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one turn may take from the end of speech")
    p.add_argument("--json", default=str(REPO / "bench" / "results" / "realtime.json"))
    args = p.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="geniex-bench-realtime-"))
    srv = Server(data_dir)
    try:
        srv.wait_ready()
        clips: dict[str, bytes] = {}
        for text in (QUESTION, STORY):
            clips[text], speech_ms = utterance(srv.base_url, text)
            end_ms = len(clips[text]) // 2 * 1000 // RATE
            print(f"clip: {text!r}, {speech_ms} ms of speech after {end_ms - speech_ms} ms of silence, appended "
                  f"in {end_ms // 100} chunks of 100 ms in real time", flush=True)  # fmt: skip
        print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}", flush=True)
        results = asyncio.run(run_all(srv, args, clips))
        log = srv.log_text()
        server_log = Path(args.json).with_name(Path(args.json).stem + "-server.log")
        server_log.parent.mkdir(parents=True, exist_ok=True)
        server_log.write_text(log)
    finally:
        srv.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    for label, r in results.items():
        print(f"\nload average: {r['load_before']:.2f} before, {r['load_after']:.2f} after")
        report(label, r["latency"], r["rtf"], args.runs)
    opened, closed, refused = sessions_left_open(log)
    print(f"server sessions: {opened} opened, {closed} closed, {refused} refused; "
          f"{opened - closed} never closed after their client left" + (
              " (the server's session count stays up: with the default --realtime-sessions-per-key 4, a key "
              "is refused every session once 4 are left open)" if opened > closed else ""))  # fmt: skip
    done = closed_sessions(log)
    for label, r in results.items():
        left = {f"{part} {label_of(n)}": f"{sum(t.get('session_id') not in done for t in ts)} of {len(ts)}"
                for part in ("latency", "rtf") for n, ts in r[part].items() if not n.startswith("http")}  # fmt: skip
        print(f"  {label}, sessions never closed (timed turns): {left}")
    problems = [line for line in log.splitlines()
                if "Traceback" in line or '"level": "error"' in line or '"level": "warning"' in line]  # fmt: skip
    print(
        f"server log: {len(problems)} warning or error lines" + "".join(f"\n  {line[:300]}" for line in problems[:10])
    )
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"args": vars(args), "clips_ms": {k: len(v) // 48 for k, v in clips.items()},
                                "phases": results,
                                "server_sessions": {"opened": opened, "closed": closed, "refused": refused}},
                               indent=1, default=str))  # fmt: skip
    print(f"every turn: {path}; the server's log: {server_log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
