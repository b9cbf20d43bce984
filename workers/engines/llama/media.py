"""Images in a chat prompt, through llama.cpp's multimodal library (mtmd) and the model's projector.

A prompt with images is tokenized by mtmd into chunks: runs of text tokens, and image chunks that
mtmd's encoder (the projector, clip) turns into embeddings. The engine keeps a prompt as one list
of *keys*, one per KV position, so that the slots, prefix reuse and the RAM cache work on it as on
any prompt: a text position's key is its token id (>= 0); an image's positions all carry one
negative key derived from the image's content hash. Two prompts then share a prefix through an
image only when it is the same image, and a follow-up turn about it reuses its KV instead of
encoding it again. A reused prefix never ends inside an image (`whole_media`).

The marker that stands for an image in the rendered prompt is random per worker: a client's text
cannot spell it, so the images and the places they go always match.
"""

from __future__ import annotations

import ctypes
import hashlib
import secrets
from dataclasses import dataclass, field
from typing import Any

import llama_cpp as L
import structlog
from llama_cpp import mtmd_cpp as M

from protocol.wire import ErrorKind, ImageInput
from workers.engines import EngineError
from workers.engines.llama_runtime import silent_log

log = structlog.get_logger("worker.llama")

_NO_CALLBACK = M.mtmd_helper_post_decode_callback()  # a NULL function pointer: ctypes refuses None


@dataclass
class MediaPrompt:
    """A tokenized prompt with images: its keys, the image chunk at each image's first position,
    and the tokens it costs (images count as the tokens their embeddings take)."""

    keys: list[int]
    chunks: Any  # mtmd_input_chunks_p, owned: free() releases it
    at: dict[int, Any] = field(default_factory=dict)  # first position -> mtmd_input_chunk_p
    n_tokens: int = 0
    n_images: int = 0

    def free(self) -> None:
        if self.chunks is not None:
            M.mtmd_input_chunks_free(self.chunks)
            self.chunks = None
            self.at.clear()


def image_key(img: ImageInput) -> int:
    """The negative key of an image's positions: from its content, so the same pixels match."""
    h = hashlib.blake2b(digest_size=8)
    h.update(img.width.to_bytes(4, "little") + img.height.to_bytes(4, "little"))
    h.update(img.rgb)
    return -1 - (int.from_bytes(h.digest(), "little") >> 2)


def whole_media(keys: list[int], n: int) -> int:
    """`n`, moved back to the start of the image it would cut in two (KV of half an image is useless)."""
    while 0 < n < len(keys) and keys[n] < 0 and keys[n - 1] == keys[n]:
        n -= 1
    return n


def text_run(keys: list[int]) -> int:
    """How many keys from the start are text tokens, before the next image."""
    for i, k in enumerate(keys):
        if k < 0:
            return i
    return len(keys)


def flatten(messages: list[dict[str, Any]], marker: str) -> tuple[list[dict[str, Any]], int]:
    """Messages whose content is a list of parts ({"type": "text", "text"} or {"type": "image"}),
    as chat templates expect them: one string, each image as `marker`; and how many images."""
    out, n = [], 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image":
                    texts.append(marker)
                    n += 1
                elif isinstance(part, dict):
                    texts.append(str(part.get("text") or ""))
            m = {**m, "content": "".join(texts)}
        out.append(m)
    return out, n


class Media:
    """A worker's mtmd context: its projector, bound to the worker's language model."""

    def __init__(self, mmproj: str, model: ctypes.c_void_p, threads: int, gpu: bool = False) -> None:
        M.mtmd_log_set(silent_log, ctypes.c_void_p(0))
        M.mtmd_helper_log_set(silent_log, ctypes.c_void_p(0))
        params = M.mtmd_context_params_default()
        params.use_gpu = gpu
        params.print_timings = False
        params.n_threads = threads
        params.warmup = False
        self.marker = f"<__media_{secrets.token_hex(8)}__>"
        self._marker_bytes = self.marker.encode()  # kept alive: the params hold a pointer to it
        params.media_marker = self._marker_bytes
        self.ctx = M.mtmd_init_from_file(mmproj.encode(), model, params)
        if not self.ctx:
            raise EngineError(f"llama.cpp could not load {mmproj} as a multimodal projector for this model",
                              kind=ErrorKind.ENGINE)  # fmt: skip
        self.vision = bool(M.mtmd_support_vision(self.ctx))
        self.audio = bool(M.mtmd_support_audio(self.ctx))
        # M-RoPE models (Qwen2-VL and kin) place an image on a 2-D grid of positions that the
        # one-key-per-position prompt above does not describe yet.
        self.mrope = bool(M.mtmd_decode_use_mrope(self.ctx))

    def tokenize(self, text: str, images: list[ImageInput], *, add_special: bool) -> MediaPrompt:
        if not self.vision:
            raise EngineError("`messages`: this model's projector has no image encoder", kind=ErrorKind.UNSUPPORTED)
        if self.mrope:
            raise EngineError("`messages`: images for this model's position layout (M-RoPE) are not supported yet",
                              kind=ErrorKind.UNSUPPORTED)  # fmt: skip
        bitmaps = []
        try:
            for img in images:
                if img.width < 1 or img.height < 1 or len(img.rgb) != img.width * img.height * 3:
                    raise EngineError("`messages`: an image's pixels do not match its size")
                data = (ctypes.c_uint8 * len(img.rgb)).from_buffer_copy(img.rgb)
                bmp = M.mtmd_bitmap_init(img.width, img.height, data)
                if not bmp:
                    raise EngineError("llama.cpp could not take an image", kind=ErrorKind.ENGINE)
                bitmaps.append(bmp)
            raw = text.encode()
            inp = M.mtmd_input_text()
            inp.text = raw
            inp.text_len = len(raw)
            inp.add_special = add_special
            inp.parse_special = True
            chunks = M.mtmd_input_chunks_init()
            arr = (M.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            rc = M.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), arr, len(bitmaps))
        finally:
            for bmp in bitmaps:
                M.mtmd_bitmap_free(bmp)
        prompt = MediaPrompt([], chunks)
        if rc != 0:
            prompt.free()
            if rc == 1:
                raise EngineError("`messages`: the number of images does not match the places the prompt has for them")
            raise EngineError(f"`messages`: the images could not be prepared (mtmd status {rc})")
        keys = iter([image_key(img) for img in images])
        n_out = ctypes.c_size_t(0)
        for i in range(M.mtmd_input_chunks_size(chunks)):
            chunk = M.mtmd_input_chunks_get(chunks, i)
            kind = M.mtmd_input_chunk_get_type(chunk)
            if kind == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
                ptr = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n_out))
                prompt.keys.extend(ptr[: n_out.value])
                prompt.n_tokens += n_out.value
            elif kind == M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                prompt.at[len(prompt.keys)] = chunk
                prompt.keys.extend([next(keys)] * M.mtmd_input_chunk_get_n_pos(chunk))
                prompt.n_tokens += M.mtmd_input_chunk_get_n_tokens(chunk)
                prompt.n_images += 1
            else:
                prompt.free()
                raise EngineError("`messages`: only images are supported as media", kind=ErrorKind.UNSUPPORTED)
        if not prompt.keys or prompt.keys[-1] < 0:
            prompt.free()
            raise EngineError("`messages`: a prompt must end with text after its last image")
        return prompt

    def evaluate(self, chunk: Any, lctx: ctypes.c_void_p, n_past: int, seq: int, n_batch: int) -> int:
        """Encode one image chunk and decode its embeddings into sequence `seq` from `n_past`;
        the position after it. Runs on its own: a decode of embeddings cannot carry tokens."""
        if M.mtmd_encode_chunk(self.ctx, chunk) != 0:
            raise EngineError("llama.cpp could not encode an image", kind=ErrorKind.ENGINE)
        embd = M.mtmd_get_output_embd(self.ctx)
        new_past = L.llama_pos(n_past)
        rc = M.mtmd_helper_decode_image_chunk(self.ctx, lctx, chunk, embd, n_past, seq, n_batch,
                                              ctypes.byref(new_past), _NO_CALLBACK, None)  # fmt: skip
        if rc != 0:
            raise EngineError(f"llama_decode failed on an image with status {rc}", kind=ErrorKind.ENGINE)
        return int(new_past.value)

    def close(self) -> None:
        if self.ctx:
            M.mtmd_free(self.ctx)
            self.ctx = None
