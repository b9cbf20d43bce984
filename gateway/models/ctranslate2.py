"""CTranslate2 model folders (Whisper for speech to text), read without loading CTranslate2.

A converted model is a folder: `model.bin` (a small header naming the model spec, then every
variable with its shape and data type), `config.json`, and the tokenizer. The header says what
the model is (`WhisperSpec`) and in which precision its weights are stored, which is what the
store needs to import a folder and name its variant.
"""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path
from typing import BinaryIO

MODEL_FILE = "model.bin"
# What a Whisper folder needs (tokenizer.json: the worker never downloads one) and may carry.
WHISPER_REQUIRED = (MODEL_FILE, "config.json", "tokenizer.json")
WHISPER_OPTIONAL = ("preprocessor_config.json", "vocabulary.txt", "vocabulary.json")
WHISPER_SPEC = "WhisperSpec"
# CTranslate2's DataType enum, as model.bin stores it, named as GenieX names precisions.
_DTYPES = {0: "fp32", 1: "int8", 2: "int16", 3: "int32", 4: "fp16", 5: "bf16", 6: "fp8", 7: "fp8"}
_MAX_VARIABLES = 100_000  # a real model has hundreds; a bound for a hostile or broken header
_MAX_RANK = 8


class NotCTranslate2(ValueError):
    """The file is not a CTranslate2 model.bin this reader understands."""


def _u8(f: BinaryIO) -> int:
    return _unpack(f, "<B")


def _u16(f: BinaryIO) -> int:
    return _unpack(f, "<H")


def _u32(f: BinaryIO) -> int:
    return _unpack(f, "<I")


def _unpack(f: BinaryIO, fmt: str) -> int:
    size = struct.calcsize(fmt)
    raw = f.read(size)
    if len(raw) != size:
        raise NotCTranslate2("truncated header")
    value: int = struct.unpack(fmt, raw)[0]
    return value


def _string(f: BinaryIO) -> str:
    n = _u16(f)
    raw = f.read(n)
    if len(raw) != n:
        raise NotCTranslate2("truncated header")
    return raw.rstrip(b"\0").decode("utf-8", errors="replace")


def read_header(path: Path) -> tuple[str, str]:
    """(spec name, precision): the precision is the data type holding most of the weights' bytes."""
    with path.open("rb") as f:
        version = _u32(f)
        if not 1 <= version <= 100:
            raise NotCTranslate2(f"unknown model.bin version {version}")
        spec = _string(f) if version >= 2 else ""
        if version >= 3:
            _u32(f)  # spec revision
        bytes_by_type: Counter[str] = Counter()
        n_variables = _u32(f)
        if n_variables > _MAX_VARIABLES:
            raise NotCTranslate2(f"{n_variables} variables")
        for _ in range(n_variables):
            _string(f)  # name
            rank = _u8(f)
            if rank > _MAX_RANK:
                raise NotCTranslate2(f"a variable of rank {rank}")
            for _ in range(rank):
                _u32(f)
            dtype = _u8(f) if version >= 4 else 0
            n_bytes = _u32(f)
            f.seek(n_bytes, 1)
            bytes_by_type[_DTYPES.get(dtype, f"type{dtype}")] += n_bytes
    if not bytes_by_type:
        raise NotCTranslate2("no variables")
    return spec, bytes_by_type.most_common(1)[0][0]


def whisper_precision(folder: Path) -> str | None:
    """`ct2-<dtype>` when `folder` is a CTranslate2 Whisper model, else None."""
    try:
        spec, dtype = read_header(folder / MODEL_FILE)
    except (OSError, NotCTranslate2):
        return None
    return f"ct2-{dtype}" if spec == WHISPER_SPEC else None
