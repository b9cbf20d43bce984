"""Genie bundles for the tests: the layout Qualcomm AI Hub exports (genie_config.json, tokenizer.json,
QNN context binaries, the HTP extensions config), with dummy binaries: no bundle that Genie can run
is made here (that needs Qualcomm's tools and a device, or a specially prepared simulator)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers

WORDS = ("hi", "hello", "world", "user", "assistant", "system", "be", "brief", ":", "<|im_start|>", "<|im_end|>")
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def word_tokenizer(path: Path) -> Path:
    """A small word-level tokenizer.json the tokenizers package reads: one token per word."""
    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.save(str(path))
    return path


def genie_config(**dialog: Any) -> dict[str, Any]:
    """A config shaped like AI Hub's, its dialog's top-level fields replaced by `dialog`."""
    base: dict[str, Any] = {
        "version": 1,
        "type": "basic",
        "context": {"version": 1, "size": 512, "n-vocab": len(WORDS) + 1, "bos-token": -1, "eos-token": 0},
        "sampler": {"version": 1, "seed": 42, "temp": 0.8, "top-k": 40, "top-p": 0.95},
        "tokenizer": {"version": 1, "path": "tokenizer.json"},
        "engine": {
            "version": 1,
            "n-threads": 3,
            "backend": {
                "version": 1,
                "type": "QnnHtp",
                "extensions": "htp_backend_ext_config.json",
                # What Genie's schema requires of an HTP backend (it refuses the config without them).
                "QnnHtp": {
                    "version": 1,
                    "use-mmap": True,
                    "spill-fill-bufsize": 0,
                    "mmap-budget": 0,
                    "poll": True,
                    "cpu-mask": "0xe0",
                    "kv-dim": 64,
                    "allow-async-init": False,
                },
            },
            "model": {
                "version": 1,
                "type": "binary",
                "binary": {"version": 1, "ctx-bins": ["part1_of_2.bin", "part2_of_2.bin"]},
            },
        },
    }
    base.update(dialog)
    return {"dialog": base}


def write_bundle(folder: Path, config: dict[str, Any] | None = None, *, chat_template: str | None = None) -> Path:
    """A bundle folder: the config (AI Hub's shape unless given), a word tokenizer, two dummy context
    binaries, the HTP extensions config, and tokenizer_config.json with `chat_template` when given."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "genie_config.json").write_text(json.dumps(config if config is not None else genie_config()))
    word_tokenizer(folder / "tokenizer.json")
    for name in ("part1_of_2.bin", "part2_of_2.bin"):
        (folder / name).write_bytes(b"not a QNN context binary" * 40)
    (folder / "htp_backend_ext_config.json").write_text(json.dumps({"devices": [{"soc_model": 60, "dsp_arch": "v73"}]}))
    if chat_template is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": chat_template,
                                                                  "eos_token": "<|im_end|>"}))  # fmt: skip
    return folder
