"""A SYNTHETIC LLaVA-style multimodal projector (mmproj GGUF) for SmolLM2, for tests.

No package we can reach carries real vision weights, but an mmproj is just a GGUF, so the tests
write one with the `gguf` package (well under a second). llama.cpp's real clip/mtmd path runs it
unchanged; what it "sees" is only colour:

- the vision tower has no transformer blocks: each 14x14 patch's embedding is its mean colour
  (the patch convolution averages each channel; mean 0 and std 1, so pixels stay in 0..1);
- the projector's first layer is a bank of colour detectors (for red: +r -g -b - bias), so that
  after GELU a detector is about 4 for its colour and about 0 for any colour one channel away;
- its second layer maps each detector to SmolLM2's own token embedding of the colour's word
  (dequantised from the model's embedding table), scaled so that a saturated colour lands at
  SCALE times the word's embedding (at about half of it the model's prior wins for some colours).

A 56x56 image (the projector's image size; larger ones are resized to it) gives 4x4 patches,
16 image tokens. SmolLM2 then answers a question about a solid-colour image with that colour.
This proves the serving pipeline, not vision.

    python -m tests.vision_projector MODEL.gguf OUT.gguf
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

PATCH = 14
IMAGE = 56  # 4x4 patches: 16 image tokens per image
IMAGE_TOKENS = (IMAGE // PATCH) ** 2
N_EMBD = 8  # the vision tower's width: r, g, b and zeros
SHARPNESS = 8.0  # detector gain: a match scores 0.5 * SHARPNESS before GELU, a miss at most -0.5 * it
SCALE = 1.75  # a saturated colour's projected row, in units of its word's embedding
# Blue is left out: SmolLM2 says "blue" without any image.
COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (1, 0, 0),
    "green": (0, 1, 0),
    "yellow": (1, 1, 0),
    "white": (1, 1, 1),
    "black": (0, 0, 0),
}


def word_embeddings(model_gguf: Path, words: list[str]) -> np.ndarray:
    """SmolLM2's input embeddings (float32) of the token for " word" (GPT-2 BPE spells the
    leading space "Ġ"), or of "word" when the vocabulary has no spaced form."""
    reader = gguf.GGUFReader(str(model_gguf))
    field = reader.fields["tokenizer.ggml.tokens"]
    vocab = {bytes(field.parts[i]).decode("utf-8", "replace"): n for n, i in enumerate(field.data)}
    ids = []
    for w in words:
        tok = vocab.get("Ġ" + w, vocab.get(w))
        if tok is None:
            raise ValueError(f"{w!r} is not one token of this vocabulary")
        ids.append(tok)
    t = next(t for t in reader.tensors if t.name == "token_embd.weight")
    table = gguf.dequantize(t.data, t.tensor_type)  # shape (n_vocab, n_embd)
    return np.asarray(table[ids], dtype=np.float32)


def build(model_gguf: Path, out: Path, *, scale: float = SCALE) -> Path:
    words = list(COLOURS)
    embd = word_embeddings(model_gguf, words)  # (n_colours, n_text_embd)
    n_text = embd.shape[1]
    n_det = len(words)

    # Patch convolution: output channel c (c < 3) is the mean of input channel c over the patch.
    patch = np.zeros((N_EMBD, 3, PATCH, PATCH), dtype=np.float32)
    for c in range(3):
        patch[c, c] = 1.0 / (PATCH * PATCH)
    pos = np.zeros((IMAGE_TOKENS, N_EMBD), dtype=np.float32)

    # Detectors: +1 for a channel the colour has, -1 for one it lacks; the bias puts a match at 0.5.
    w0 = np.zeros((n_det, N_EMBD), dtype=np.float32)
    b0 = np.zeros(n_det, dtype=np.float32)
    for i, rgb in enumerate(COLOURS.values()):
        p = np.asarray(rgb, dtype=np.float32)
        w0[i, :3] = SHARPNESS * (2 * p - 1)
        b0[i] = SHARPNESS * (0.5 - p.sum())
    # Rows: a firing detector (GELU(0.5 * SHARPNESS) ~ 0.5 * SHARPNESS) adds `scale` word embeddings.
    w2 = (scale / (0.5 * SHARPNESS)) * embd.T  # (n_text, n_det)
    b2 = np.zeros(n_text, dtype=np.float32)

    w = gguf.GGUFWriter(str(out), "clip")
    w.add_string("general.name", "SYNTHETIC colour projector for SmolLM2 (tests only)")
    w.add_string("general.description", "mean colour per patch -> colour-word embeddings; not a vision model")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_audio_encoder", False)
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", IMAGE)
    w.add_uint32("clip.vision.patch_size", PATCH)
    w.add_uint32("clip.vision.embedding_length", N_EMBD)
    w.add_uint32("clip.vision.feed_forward_length", N_EMBD)
    w.add_uint32("clip.vision.projection_dim", n_text)
    w.add_uint32("clip.vision.attention.head_count", 1)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.block_count", 0)
    w.add_array("clip.vision.image_mean", [0.0, 0.0, 0.0])
    w.add_array("clip.vision.image_std", [1.0, 1.0, 1.0])
    w.add_tensor("v.patch_embd.weight", patch)
    w.add_tensor("v.position_embd.weight", pos)
    w.add_tensor("mm.0.weight", w0)
    w.add_tensor("mm.0.bias", b0)
    w.add_tensor("mm.2.weight", np.ascontiguousarray(w2, dtype=np.float32))
    w.add_tensor("mm.2.bias", b2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def solid_png(rgb: tuple[int, int, int], size: int = IMAGE) -> bytes:
    """A solid-colour PNG (Pillow)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), rgb).save(buf, format="PNG")
    return buf.getvalue()


if __name__ == "__main__":
    print(build(Path(sys.argv[1]), Path(sys.argv[2])))
