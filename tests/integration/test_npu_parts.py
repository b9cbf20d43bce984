"""A decoder converted in chained parts (npu_plan.split: at most PART_LIMIT of weights per graph)
computes what the one-graph conversion does, and the parts are what the plan says.

CPU EP only. SmolLM2 with a small part limit (its 30 layers in 3 parts, the head in a 4th), against
its one-graph conversion; and a random-weight GGUF of Llama-3.2-1B's shape (49152-row vocabulary
instead of 128256, Q4_0 matrices and a Q8_0 tied head), converted in a subprocess that reports its
time and peak RSS, in one graph and in two parts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import llama_cpp as L
import numpy as np
import pytest

from protocol.gguf_header import npu_shape
from protocol.npu_plan import PART_LIMIT, SOCS, split
from tests.npu_models import PARTS_LIMIT, bundled_gguf, converted, converted_parts, llama_shaped_gguf
from workers.engines.npu.convert import GRAPH_FILE, DecoderConfig
from workers.engines.npu.decoder import Decoder, context_file, cpu_session_factory

PROMPT = b"The capital of France is Paris, and the capital of Italy is"
SEQUENCE = b"Continue the sequence: 1, 2, 3, 4,"
N_CTX = 64
CHUNK = 8  # the 13-token prompt: one full chunk and one padded one
SMALL_LIMIT = PARTS_LIMIT  # SmolLM2's 30 layers in 3 parts, its head in a 4th
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return converted_parts(tmp_path_factory)  # shared with test_npu_iobinding


def test_the_parts_are_the_plans(parts: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    cfg = DecoderConfig.load(parts)
    # The converter's shape is the one the gateway plans with, from the GGUF's header.
    assert cfg.shape() == npu_shape(bundled_gguf())
    assert DecoderConfig.load(converted(tmp_path_factory)).shape() == cfg.shape()
    plan = split(cfg.shape(), SMALL_LIMIT)
    assert [(p.first_layer, p.end_layer, p.head) for p in cfg.parts] == [
        (p.first_layer, p.end_layer, p.head) for p in plan]  # fmt: skip
    assert [(p.first_layer, p.end_layer) for p in cfg.parts] == [(0, 14), (14, 28), (28, 30), (30, 30)]
    assert [(p.graph, p.weights, p.input, p.output) for p in cfg.parts] == [
        ("part0.onnx", "part0.onnx.data", "inputs_embeds", "hidden_out"),
        ("part1.onnx", "part1.onnx.data", "hidden", "hidden_out"),
        ("part2.onnx", "part2.onnx.data", "hidden", "hidden_out"),
        ("part3.onnx", "part3.onnx.data", "hidden", "logits")]  # fmt: skip
    for part, planned in zip(cfg.parts, plan, strict=True):
        assert part.planned_bytes == planned.weight_bytes <= SMALL_LIMIT
        assert part.weight_bytes == (parts / part.weights).stat().st_size
        assert abs(part.weight_bytes - planned.weight_bytes) <= 0.01 * planned.weight_bytes, (part, planned)
    assert not (parts / GRAPH_FILE).exists()
    # Each part's compiled shapes are cached under names of their own.
    names = {context_file(parts / p.graph, {"seq": 1, "past": N_CTX}, "x-elite", False).name for p in cfg.parts}
    assert len(names) == len(cfg.parts)


def test_the_head_alone_takes_only_the_hidden_state(parts: Path) -> None:
    import onnx

    cfg = DecoderConfig.load(parts)
    head = onnx.load(str(parts / cfg.parts[-1].graph), load_external_data=False).graph
    assert [i.name for i in head.input] == ["hidden"] and [o.name for o in head.output] == ["logits"]
    middle = onnx.load(str(parts / cfg.parts[1].graph), load_external_data=False).graph
    layers = range(14, 28)
    assert [i.name for i in middle.input] == ["hidden", "attn_mask", "rope_cos", "rope_sin"] + [
        f"past_{kind}_{i}" for i in layers for kind in ("key", "value")]  # fmt: skip
    assert [o.name for o in middle.output] == ["hidden_out"] + [
        f"present_{kind}_{i}" for i in layers for kind in ("key", "value")]  # fmt: skip


def test_parts_give_the_one_graphs_logits_and_tokens(parts: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    one = converted(tmp_path_factory)
    llm = L.Llama(bundled_gguf(), n_ctx=N_CTX, verbose=False, vocab_only=True)
    tokens = llm.tokenize(PROMPT, add_bos=False) + llm.tokenize(b" Rome. And", add_bos=False)
    decoders = [Decoder(f, DecoderConfig.load(f), N_CTX, cpu_session_factory(2), chunk=CHUNK) for f in (one, parts)]
    assert [len(d.parts) for d in decoders] == [1, 4]
    runs = [[d.prefill(tokens[:-4])] + [d.decode(t) for t in tokens[-4:]] for d in decoders]
    diffs = [float(np.abs(a - b).max()) for a, b in zip(*runs, strict=True)]
    assert max(diffs) < 1e-4, diffs
    # The K/V each part wrote is the one graph's.
    for i in (0, 13, 14, 29):
        assert np.abs(decoders[0].keys[i] - decoders[1].keys[i]).max() < 1e-4
        assert np.abs(decoders[0].values[i] - decoders[1].values[i]).max() < 1e-4
    prompt = llm.tokenize(SEQUENCE, add_bos=False)
    greedy = []
    for d in decoders:
        d.reset()
        logits, got = d.prefill(prompt), []
        for _ in range(16):
            assert logits is not None
            got.append(int(np.argmax(logits)))
            logits = d.decode(got[-1])
        greedy.append(got)
    assert greedy[0] == greedy[1], [llm.detokenize(g) for g in greedy]


# ---- at scale: Llama-3.2-1B's shape ------------------------------------------------------------

SCALE_LIMIT = 400_000_000  # forces two parts on the 1B shape (its 0.72 GB fit one at PART_LIMIT)
CONVERT = """
import json, resource, sys, time
from pathlib import Path
from workers.engines.npu.convert import convert
t0 = time.perf_counter()
convert(sys.argv[1], Path(sys.argv[2]), part_limit=int(sys.argv[3]))
print(json.dumps({"seconds": time.perf_counter() - t0,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def convert_measured(gguf: str, out: Path, part_limit: int) -> dict[str, Any]:
    """Convert in a child process: its time and peak RSS (which counts the GGUF's memory-mapped
    pages it read: about the file's size, file-backed and reclaimable)."""
    done = subprocess.run([sys.executable, "-c", CONVERT, gguf, str(out), str(part_limit)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_a_1b_model_converts_in_parts_within_the_limits(tmp_path: Path) -> None:
    gguf = llama_shaped_gguf(tmp_path / "llama-1b-shape.gguf")
    shape = npu_shape(gguf)
    assert split(shape) == [split(shape)[0]] and len(split(shape, SCALE_LIMIT)) == 2
    report = {}
    folders = {}
    for limit in (PART_LIMIT, SCALE_LIMIT):
        folders[limit] = tmp_path / f"onnx-{limit}"
        report[limit] = convert_measured(gguf, folders[limit], limit)
        cfg = DecoderConfig.load(folders[limit])
        assert cfg.shape() == shape
        plan = split(shape, limit)
        assert [(p.first_layer, p.end_layer, p.head) for p in cfg.parts] == [
            (p.first_layer, p.end_layer, p.head) for p in plan]  # fmt: skip
        for part, planned in zip(cfg.parts, plan, strict=True):
            assert part.weight_bytes == (folders[limit] / part.weights).stat().st_size
            assert part.weight_bytes <= SOCS["x-elite"].binary_limit and part.weight_bytes <= 1.01 * limit
            assert abs(part.weight_bytes - planned.weight_bytes) <= 0.02 * planned.weight_bytes, (part, planned)
        total = sum(p.weight_bytes for p in cfg.parts)
        assert total <= 0.7 * shape.params, total / shape.params
        report[limit].update(parts=[(p.graph, p.first_layer, p.end_layer, p.weight_bytes) for p in cfg.parts],
                             bytes_per_param=round(total / shape.params, 4))  # fmt: skip
        assert report[limit]["seconds"] < 60, report
    print(json.dumps({"params": shape.params, **{str(k): v for k, v in report.items()}}))
    # The two parts compute what the one graph does.
    runs = []
    for limit in (PART_LIMIT, SCALE_LIMIT):
        dec = Decoder(folders[limit], DecoderConfig.load(folders[limit]), 16, cpu_session_factory(2), chunk=4)
        runs.append([dec.prefill([1, 2, 3]), dec.decode(5)])
        del dec
    for a, b in zip(*runs, strict=True):
        assert np.isfinite(a).all() and np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
