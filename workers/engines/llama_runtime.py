"""What both llama.cpp engines (chat and embeddings) and the draft model share: starting
llama.cpp, loading a model under the `ngl` rule, contexts, tokens, batch rows, the facts a
`Ready` reports, and the thread count the governor chooses for the contexts of one worker."""

from __future__ import annotations

import ctypes
import functools
import os
import re
from collections import deque
from collections.abc import Callable, Iterable

import llama_cpp as L
import psutil
import structlog

from protocol import kv_cache
from protocol.wire import PROTOCOL_VERSION, Device, ErrorKind, Ready
from workers.engines import EngineError
from workers.engines.thread_governor import ThreadGovernor

log = structlog.get_logger("worker.llama")


# llama.cpp's last error lines: a call that fails says only NULL, and its reason (e.g. "K cache
# type q8_0 with block size 32 does not divide n_embd_head_k=48") goes to the log alone.
_errors: deque[str] = deque(maxlen=4)


@L.llama_log_callback
def _silent_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp's own chatter is noise in a service journal; errors surface as return codes.
    if level == 4:  # GGML_LOG_LEVEL_ERROR
        line = text.decode(errors="replace")
        _errors.append(line.strip())
        if os.environ.get("GENIEX_LLAMA_LOG"):
            print(line, end="", flush=True)


def last_error() -> str:
    """llama.cpp's last error line, without its function's name ("" when it logged none)."""
    return _errors[-1].split(": ", 1)[-1] if _errors else ""


silent_log = _silent_log  # for mtmd's own logger (llama/media.py)


def init_backend() -> None:
    L.llama_backend_init()
    L.llama_log_set(_silent_log, ctypes.c_void_p(0))


NO_GPU_OFFLOAD = "this llama.cpp build has no GPU offload"


def gpu_offload() -> bool:
    return bool(L.llama_supports_gpu_offload())


NO_HTP = "this llama.cpp build has no Hexagon NPU device (HTP: a build with GGML_HEXAGON on a Snapdragon)"


def runs_on(compute: str) -> tuple[str, str]:
    """The unit a llama.cpp worker really runs on, and why it is not `compute` ("" when it is).
    The gateway asks for `gpu` before any worker has told it whether the build offloads: a build
    that cannot runs on the CPU and says so, in its log and in Ready.fallback. `npu` reaches this
    engine only once a worker has reported llama.cpp's own Hexagon device (HTP)."""
    why = ""
    if compute == "gpu" and not gpu_offload():
        why = NO_GPU_OFFLOAD
    elif compute == "npu" and not htp_devices():
        why = NO_HTP
    if why:
        log.warning("compute unit unavailable; falling back to cpu", requested=compute, reason=why)
        return "cpu", why
    return compute, ""


def htp_devices() -> list[str]:
    """The names of llama.cpp's Hexagon NPU devices (ggml-hexagon's "HTP0", ...) this build sees."""
    return [d.name for d in devices() if d.name.upper().startswith("HTP")]


# ggml_backend_dev_type, in its enum's order.
DEVICE_KINDS = ("cpu", "gpu", "igpu", "accel", "meta")


def devices() -> list[Device]:
    """The ggml backend devices this build sees; [] when it cannot say. llama-cpp-python binds
    none of ggml's device registry, so it is read from libggml directly."""
    try:
        from llama_cpp._ggml import libggml as g

        g.ggml_backend_dev_count.restype = ctypes.c_size_t
        g.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        g.ggml_backend_dev_get.restype = ctypes.c_void_p
        for fn in (g.ggml_backend_dev_name, g.ggml_backend_dev_description):
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_char_p
        g.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        g.ggml_backend_dev_type.restype = ctypes.c_int
        g.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                              ctypes.POINTER(ctypes.c_size_t)]  # fmt: skip
        g.ggml_backend_dev_memory.restype = None
        found = []
        for i in range(g.ggml_backend_dev_count()):
            d = g.ggml_backend_dev_get(i)
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            g.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
            kind = g.ggml_backend_dev_type(d)
            found.append(Device(
                name=g.ggml_backend_dev_name(d).decode(errors="replace"),
                kind=DEVICE_KINDS[kind] if 0 <= kind < len(DEVICE_KINDS) else "unknown",
                description=g.ggml_backend_dev_description(d).decode(errors="replace"),
                memory_total=total.value, memory_free=free.value))  # fmt: skip
        return found
    except (ImportError, AttributeError, OSError):  # a build or binding without the registry: not worth failing a load
        return []


def backend_names() -> list[str]:
    """The ggml backends this build registered ("CPU", "Vulkan", "OpenCL", ...), whether or not they
    found a device: a Vulkan build on a machine whose only driver runs on the CPU has no device."""
    try:
        from llama_cpp._ggml import libggml as g

        g.ggml_backend_reg_count.restype = ctypes.c_size_t
        g.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
        g.ggml_backend_reg_get.restype = ctypes.c_void_p
        g.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
        g.ggml_backend_reg_name.restype = ctypes.c_char_p
        return [g.ggml_backend_reg_name(g.ggml_backend_reg_get(i)).decode(errors="replace")
                for i in range(g.ggml_backend_reg_count())]  # fmt: skip
    except (ImportError, AttributeError, OSError):
        return []


def offloaded_layers(model: ctypes.c_void_p, n_gpu_layers: int) -> tuple[int, int]:
    """(layers on the GPU, layers in all), counted as llama.cpp's "offloaded N/M layers" does: the
    repeating layers, then the output layer once every one of them is offloaded."""
    total = L.llama_model_n_layer(model) + 1
    return min(max(0, n_gpu_layers), total) if gpu_offload() else 0, total


def gpu_layers(compute: str, ngl: int) -> int:
    """The `ngl` rule: layers offload only when the worker runs on the GPU (or llama.cpp's NPU
    device); -1 (or the spec's 999, or anything past the model's layers) means all of them."""
    if compute not in ("gpu", "npu"):
        return 0
    return 999 if ngl < 0 else ngl


def load_model(path: str, n_gpu_layers: int, *, field: str = "", only: list[str] | None = None) -> ctypes.c_void_p:
    """The model at `path`, its offloaded layers on the devices named `only` (None: llama.cpp's
    choice, every GPU). A model a request named (`field`) that cannot load is that request's
    fault (400); the worker's own model failing is the engine's (500)."""
    mparams = L.llama_model_default_params()
    mparams.n_gpu_layers = n_gpu_layers
    chosen = _device_list(only) if only else None
    if chosen is not None:
        mparams.devices = ctypes.cast(chosen, ctypes.c_void_p)
    model = L.llama_model_load_from_file(path.encode(), mparams)
    if not model:
        if field:
            raise EngineError(f"`{field}`: llama.cpp could not load {path} as a model")
        raise EngineError(f"llama.cpp could not load {path}", kind=ErrorKind.ENGINE)
    return model


def _device_list(names: list[str]) -> ctypes.Array[ctypes.c_void_p]:
    """ggml devices by name, as llama_model_params.devices takes them (NULL-terminated)."""
    from llama_cpp._ggml import libggml as g

    g.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
    g.ggml_backend_dev_by_name.restype = ctypes.c_void_p
    found = [g.ggml_backend_dev_by_name(n.encode()) for n in names]
    if not all(found):
        raise EngineError(f"llama.cpp has no device {names}", kind=ErrorKind.ENGINE)
    return (ctypes.c_void_p * (len(found) + 1))(*found, None)


def default_threads(threads: int) -> int:
    return threads or psutil.cpu_count(logical=False) or os.cpu_count() or 1


def keep_on_cpu(cparams: L.llama_context_params, offload: bool) -> None:
    """With no layer offloaded (`compute: cpu`, or `ngl: 0`), nothing runs on a GPU either: a build
    with a GPU backend would otherwise still send a long prompt's matrix products and the KV cache
    to the device (llama.cpp's op_offload and offload_kqv), which on lavapipe made the CPU worker's
    prefill 100x slower, and on a laptop wakes a GPU the request did not ask for."""
    cparams.op_offload = offload
    cparams.offload_kqv = offload


def kv_type(option: str, name: str) -> int:
    """ggml's id of a KV cache type the gateway named (protocol/kv_cache.py), checked against this
    build's own name for it: a binding whose enum moved would otherwise store another type."""
    t = kv_cache.KV_TYPES.get(name)
    if t is None:
        raise EngineError(f"{option} {name!r}: choose from {', '.join(kv_cache.KV_TYPES)}", kind=ErrorKind.ENGINE)
    g = _ggml_types()
    if g.ggml_type_name(t.ggml_type) != name.encode():
        raise EngineError(f"{option} {name}: this llama.cpp build has no such KV cache type", kind=ErrorKind.ENGINE)
    return t.ggml_type


@functools.cache
def _ggml_types() -> ctypes.CDLL:
    """libggml with its type functions declared (llama-cpp-python binds none of them)."""
    from llama_cpp._ggml import libggml as g

    g.ggml_type_name.argtypes = [ctypes.c_int]
    g.ggml_type_name.restype = ctypes.c_char_p
    g.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    g.ggml_row_size.restype = ctypes.c_size_t
    return g


def kv_bytes_per_token(model: ctypes.c_void_p, type_k: str, type_v: str) -> int:
    """One token's K and V in every layer of `model`'s KV cache, in bytes: a layer's K row is
    n_head_kv * key_length values of `type_k`, measured by ggml's own row size (what llama.cpp
    allocates per cell); V likewise. A model of layers that differ (sliding windows, recurrent
    layers) is counted as if every layer were its first."""
    arch = meta(model, "general.architecture") or ""
    n_head = max(1, L.llama_model_n_head(model))
    k_len = int(meta(model, f"{arch}.attention.key_length") or L.llama_model_n_embd(model) // n_head)
    v_len = int(meta(model, f"{arch}.attention.value_length") or k_len)
    n_head_kv = L.llama_model_n_head_kv(model)
    g = _ggml_types()
    k = g.ggml_row_size(kv_type("--cache-type-k", type_k), n_head_kv * k_len)
    v = g.ggml_row_size(kv_type("--cache-type-v", type_v), n_head_kv * v_len)
    return int(L.llama_model_n_layer(model) * (k + v))


def slot_context(model: ctypes.c_void_p, *, nctx: int, parallel: int, n_batch: int, threads: int,
                 what: str = "context", offload: bool = False, type_k: str = kv_cache.DEFAULT,
                 type_v: str = kv_cache.DEFAULT) -> ctypes.c_void_p:  # fmt: skip
    """A context of `parallel` sequences of `nctx` tokens each (kv_unified=False: see llama/engine.py).
    `offload`: some layers are on a GPU (see `keep_on_cpu`). Its KV cache is stored in `type_k` and
    `type_v` (protocol/kv_cache.py): llama.cpp stores a quantized V only with flash attention, so
    that is turned on for one (`auto` could settle on off for a device without it, and fail);
    otherwise it stays llama.cpp's `auto`, which is on for the CPU."""
    cparams = L.llama_context_default_params()
    keep_on_cpu(cparams, offload)
    try:
        cparams.type_k = kv_type("--cache-type-k", type_k)
        cparams.type_v = kv_type("--cache-type-v", type_v)
    except EngineError:
        L.llama_model_free(model)
        raise
    if kv_cache.is_quantized(type_v):
        cparams.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
    cparams.n_ctx = nctx * parallel
    cparams.n_batch = n_batch
    cparams.n_ubatch = n_batch
    cparams.n_seq_max = parallel
    cparams.kv_unified = False
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    cparams.no_perf = True
    _errors.clear()
    ctx = L.llama_init_from_model(model, cparams)
    if not ctx:
        L.llama_model_free(model)
        why = last_error()
        raise EngineError(f"llama.cpp could not create a {what} of {cparams.n_ctx} tokens with --cache-type-k "
                          f"{type_k} and --cache-type-v {type_v}" + (f": {why}" if why else ""),
                          kind=ErrorKind.ENGINE)  # fmt: skip
    return ctx


def put(batch: L.llama_batch, row: int, token: int, pos: int, seq: int, logits: bool = True) -> int:
    """Fill one row of `batch` (every field: llama_batch_init leaves them uninitialised); the next row."""
    batch.token[row] = token
    batch.pos[row] = pos  # type: ignore[call-overload]  # the bindings type this int32 array as an array of arrays
    batch.n_seq_id[row] = 1
    batch.seq_id[row][0] = seq
    batch.logits[row] = logits
    return row + 1


def tokenize(vocab: ctypes.c_void_p, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
    raw = text.encode()
    cap = len(raw) + 8
    for _ in range(2):
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(vocab, raw, len(raw), buf, cap, add_special, parse_special)
        if n >= 0:
            return list(buf[:n])
        cap = -n  # too small: llama.cpp says how many it needs
    raise EngineError("llama.cpp could not tokenize the input", kind=ErrorKind.ENGINE)


def piece(
    vocab: ctypes.c_void_p, token: int, special: bool = True, buf: ctypes.Array[ctypes.c_char] | None = None
) -> bytes:
    """The bytes of one token (empty for a negative id); `buf` saves an allocation per token."""
    if token < 0:
        return b""
    buf = buf or ctypes.create_string_buffer(256)
    n = L.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = L.llama_token_to_piece(vocab, token, buf, -n, 0, special)
    return buf.raw[: max(n, 0)]


def check_ids(vocab: ctypes.c_void_p, tokens: list[int], field: str = "tokens") -> None:
    n_vocab = L.llama_vocab_n_tokens(vocab)
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise EngineError(f"`{field}`: token id {bad} is not in the vocabulary (0..{n_vocab - 1})")


def detokenize(vocab: ctypes.c_void_p, tokens: list[int]) -> bytes:
    """llama.cpp's own detokenizer (it knows the tokenizer's spacing rules), special tokens rendered."""
    check_ids(vocab, tokens)
    if not tokens:
        return b""
    ids = (L.llama_token * len(tokens))(*tokens)
    cap = 16 * len(tokens) + 64
    for _ in range(2):
        buf = ctypes.create_string_buffer(cap)
        n = L.llama_detokenize(vocab, ids, len(tokens), buf, cap, False, True)
        if n >= 0:
            return buf.raw[:n]
        cap = -n
    raise EngineError("llama.cpp could not detokenize the ids", kind=ErrorKind.ENGINE)


def pieces(vocab: ctypes.c_void_p, tokens: list[int]) -> list[bytes]:
    buf = ctypes.create_string_buffer(256)
    return [piece(vocab, t, True, buf) for t in tokens]


class VocabTokens:
    """/tokenize and /detokenize for an engine that holds a llama.cpp vocabulary (`self.vocab`)."""

    vocab: ctypes.c_void_p

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return tokenize(self.vocab, text, add_special=add_special, parse_special=parse_special)

    def pieces(self, tokens: list[int]) -> list[bytes]:
        return pieces(self.vocab, tokens)

    def detokenize(self, tokens: list[int]) -> bytes:
        return detokenize(self.vocab, tokens)


def meta(model: ctypes.c_void_p, key: str) -> str | None:
    buf = ctypes.create_string_buffer(1 << 16)
    n = L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    if n < 0:
        return None
    if n >= len(buf):
        buf = ctypes.create_string_buffer(n + 1)
        L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode(errors="replace")


def cpu_features() -> str:
    """The CPU features this llama.cpp build uses, from its own system info ("AVX2 F16C FMA ...")."""
    info = L.llama_print_system_info().decode(errors="replace")
    return " ".join(re.findall(r"(\w+) = 1", info))


def ready(model: ctypes.c_void_p, *, engine: str, compute: str, n_ctx: int, parallel: int, load_seconds: float,
          description: str = "", n_gpu_layers: int = 0, **facts: object) -> Ready:  # fmt: skip
    """What a llama.cpp worker says of itself first: the model's own facts, and the engine's."""
    offloaded, n_layers = offloaded_layers(model, n_gpu_layers)
    desc = ctypes.create_string_buffer(256)
    L.llama_model_desc(model, desc, 256)
    base = desc.value.decode(errors="replace")
    return Ready(
        protocol_version=PROTOCOL_VERSION,
        pid=os.getpid(),
        engine=engine,
        compute=compute,
        n_ctx=n_ctx,
        n_ctx_train=L.llama_model_n_ctx_train(model),
        n_vocab=L.llama_vocab_n_tokens(L.llama_model_get_vocab(model)),
        parallel=parallel,
        model_bytes=L.llama_model_size(model),
        load_seconds=round(load_seconds, 3),
        description=f"{base} ({description})" if description else base,
        cpu_features=cpu_features(),
        gpu_offload=gpu_offload(),
        devices=devices(),
        offloaded_layers=offloaded,
        n_layers=n_layers,
        **facts,  # type: ignore[arg-type]  # the engine's own Ready fields
    )


class Threads:
    """The thread count of a worker's llama.cpp contexts: at most the gateway's share (`SetThreads`),
    fewer while other programs keep cores busy (the governor)."""

    def __init__(self, threads: int, contexts: Callable[[], Iterable[ctypes.c_void_p]]) -> None:
        self.n = self.max = threads
        self.governor = ThreadGovernor(threads)
        self._contexts = contexts

    def set_share(self, n: int) -> None:
        cap = min(max(1, n), self.max)
        if cap != self.governor.cap:
            log.info("thread share changed", cap=cap, old_cap=self.governor.cap)
        self.governor.set_cap(cap)
        self._use(self.governor.threads)

    def idle(self) -> None:
        self.governor.idle()

    def before_step(self) -> None:
        self._use(self.governor.threads_for_step())

    @property
    def tentative(self) -> bool:
        """Fewer threads than allowed, on a reading that may be stale: keep the next step short."""
        return self.governor.tentative

    def after_step(self, tokens: int, seconds: float) -> None:
        self.governor.after_step(tokens, seconds)

    def _use(self, n: int) -> None:
        if n != self.n:
            for ctx in self._contexts():
                L.llama_set_n_threads(ctx, n, n)
            log.debug(
                "threads changed", old=self.n, new=n, cap=self.governor.cap, others_busy=round(self.governor.others, 2)
            )
            self.n = n
