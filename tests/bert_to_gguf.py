"""Convert a sentence-transformers BERT folder (safetensors + tokenizer.json) to a GGUF, for tests.

llama.cpp's own convert_hf_to_gguf.py needs torch and transformers (gigabytes) to read a model
this small, so this does what its BertModel class does, with the `gguf` package alone: the same
hyper-parameters, tensor names (gguf's own BERT name map), phantom-space WordPiece vocabulary,
special tokens and pooling type. Weights stay float32, so the GGUF holds the real model exactly.

    python -m tests.bert_to_gguf MODEL_DIR OUT.gguf
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import gguf
import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
_SKIP = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a .safetensors file: an 8-byte header length, a JSON header, the raw data."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(raw[base + start : base + end], dtype=_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def pooling_type(model_dir: Path) -> gguf.PoolingType:
    modules = json.loads((model_dir / "modules.json").read_text()) if (model_dir / "modules.json").exists() else []
    for m in modules:
        if m.get("type") == "sentence_transformers.models.Pooling":
            cfg = json.loads((model_dir / m["path"] / "config.json").read_text())
            if cfg.get("pooling_mode_cls_token"):
                return gguf.PoolingType.CLS
            if cfg.get("pooling_mode_mean_tokens"):
                return gguf.PoolingType.MEAN
    return gguf.PoolingType.MEAN


def convert(
    model_dir: Path, out: Path, *, pooling: gguf.PoolingType | None = None, rank_head: np.ndarray | None = None
) -> Path:
    """`pooling` overrides the model's own; `rank_head` ([1, hidden]) adds a SYNTHETIC one-label
    classification head (`cls.output`) and rank pooling, making a test cross-encoder."""
    hp = json.loads((model_dir / "config.json").read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    n_blocks = hp["num_hidden_layers"]
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    w.add_name(model_dir.name)
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_block_count(n_blocks)
    w.add_head_count(hp["num_attention_heads"])
    w.add_layer_norm_eps(hp["layer_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_causal_attention(False)
    if rank_head is not None:
        pooling = gguf.PoolingType.RANK
    w.add_pooling_type(pooling if pooling is not None else pooling_type(model_dir))

    # Vocabulary, as the converter writes a WordPiece one: special tokens are CONTROL and kept as
    # they are; "##x" continues a word ("x"), any other piece starts one ("\u2581x").
    vocab: dict[str, int] = tok["model"]["vocab"]
    special = {t["id"] for t in tok.get("added_tokens", []) if t.get("special")}
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(max(hp["vocab_size"], len(by_id))):
        t = by_id.get(i, f"[PAD{i}]")
        if i in special:
            tokens.append(t)
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(t[2:] if t.startswith("##") else "\u2581" + t)
            types.append(gguf.TokenType.NORMAL if i in by_id else gguf.TokenType.USER_DEFINED)
    w.add_token_type_count(hp.get("type_vocab_size", 1))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(model_dir, n_vocab=len(tokens)).add_to_gguf(w)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_blocks)
    for name, data in read_safetensors(model_dir / "model.safetensors").items():
        name = name.removeprefix("bert.")
        if name in _SKIP or name.startswith("cls."):
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"no GGUF name for tensor {name}")
        w.add_tensor(new, np.ascontiguousarray(data, dtype=np.float32))
    if rank_head is not None:
        w.add_tensor("cls.output.weight", np.ascontiguousarray(rank_head, dtype=np.float32).reshape(1, -1))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


if __name__ == "__main__":
    print(convert(Path(sys.argv[1]), Path(sys.argv[2])))
