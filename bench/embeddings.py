"""/v1/embeddings speed through our server and the real SDK: ONNX (CPU EP) and the GGUF
MiniLM (llama.cpp), a batch of 32 sentences per request, and one short text.

    .venv/bin/python bench/embeddings.py [--rounds 5]

The models are set up the way the tests set them up (tests/embedding_models.py: the ONNX
int8 MiniLM with its tokenizer, and a GGUF converted from the safetensors), so it needs
the test extras (`make test` installs them). Reports median request ms per engine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import openai

from bench.launcher import Server
from tests.embedding_models import GGUF_MODEL, ONNX_MODEL, data_dir_with_models

SENTENCES = [f"Sentence number {i} is about {topic}." for i, topic in
             enumerate(["bread", "galaxies", "machine learning", "the weather"] * 8)]  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    data = data_dir_with_models(Path(tempfile.mkdtemp(prefix="geniex-bench-")))
    srv = Server(data)
    try:
        srv.wait_ready()
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
        for model in (ONNX_MODEL, GGUF_MODEL):
            client.embeddings.create(model=model, input="warm-up")  # loads the worker
            for label, inp in (("batch of 32", SENTENCES), ("one text", "food")):
                times = []
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    r = client.embeddings.create(model=model, input=inp, encoding_format="float")
                    times.append((time.perf_counter() - t0) * 1000)
                med = statistics.median(times)
                print(f"{model:48s} {label:12s} {med:8.1f} ms  ({r.usage.prompt_tokens} tokens)")
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
