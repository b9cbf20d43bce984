"""ONNX models through onnxruntime: embeddings, and reranking (cross-encoder or bi-encoder).

A model is a folder (what `geniex pull --local DIR` stores): `model.onnx` (plus any external
weight files it names), `tokenizer.json` for the `tokenizers` package, and optionally the
sentence-transformers files that say how to read its output: `1_Pooling/config.json`
(pooling mode, mean by default) and `sentence_bert_config.json` (the longest input).

What the graph outputs decides what the model is:
- `sentence_embedding` (or any 2-D output but `logits`): pooled vectors, used as they are;
- `last_hidden_state` / `token_embeddings` (3-D): token vectors, pooled with the attention mask;
- `logits` (2-D): a sequence-classification head, so a cross-encoder: it scores (query, document)
  pairs and serves reranking only.

Compute units. `cpu` runs the CPU execution provider with dynamic shapes, each batch padded to
its longest sequence. `npu` runs Qualcomm's QNN execution provider (the `onnxruntime-qnn` plugin,
HTP backend). HTP graphs have static shapes, so the NPU path pins the batch and sequence
dimensions per session and pads each input to the next length bucket (16/32/64/... tokens;
batch 1, see NPU_BATCHES), compiling a session per bucket on first use. On x86_64 the HTP backend is
Qualcomm's simulator: correct, and about a second per sequence. Which provider really ran is
measured on a probe batch at load (onnxruntime's node profile) and reported in Ready.provider;
when QNN cannot take the model the worker says so and runs on the CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import psutil
import structlog
from tokenizers import Tokenizer

from protocol import qnn
from protocol.power import POWER_SUPPLIES, on_battery
from protocol.wire import PROTOCOL_VERSION, Embed, ErrorKind, Ready, Rerank
from workers.embedding_jobs import (
    EmbeddingQueue,
    QueuedEngine,
    Seq,
    check_lengths,
    check_token_ids,
    cut_to,
    pool,
)
from workers.engines import EngineError, EngineOptions

log = structlog.get_logger("worker.onnx")

QNN = "QNNExecutionProvider"
CPU = "CPUExecutionProvider"
CPU_BATCH = 32  # sequences per forward pass on the CPU
# Static batch sizes of the NPU sessions. Only 1: in QNN's HTP graphs of MiniLM with a batch of
# 4, every row after the first came out wrong (cosine 0.66-0.81 against the CPU, where batch 1
# gives 0.99995), so the NPU runs one sequence per pass until a batched graph proves right.
NPU_BATCHES = (1,)
NPU_MIN_LEN = 16
NPU_SESSIONS = 4  # compiled NPU shapes kept at once (least recently used goes)
HIDDEN_OUTPUTS = ("last_hidden_state", "token_embeddings")
POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_mean_tokens": "mean",
}


def model_files(path: str) -> tuple[Path, Path]:
    """(folder, model.onnx) for a model folder or a path to its .onnx file."""
    p = Path(path)
    if p.is_dir():
        return p, p / "model.onnx"
    return p.parent, p


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def pooling_mode(folder: Path) -> str:
    config = _json(folder / "1_Pooling" / "config.json")
    return next((mode for key, mode in POOLING_KEYS.items() if config.get(key)), "mean")


def max_length(folder: Path, nctx: int) -> int:
    """The longest input the model reads: sentence-transformers' max_seq_length, else the
    tokenizer's or the position table's, capped by the worker's nctx."""
    candidates = [
        _json(folder / "sentence_bert_config.json").get("max_seq_length"),
        _json(folder / "tokenizer_config.json").get("model_max_length"),
        _json(folder / "config.json").get("max_position_embeddings"),
    ]
    limit = next((int(c) for c in candidates if isinstance(c, int | float) and 0 < c < 1_000_000), 512)
    return max(1, min(limit, nctx)) if nctx > 0 else limit


def qnn_options(performance: str = "auto") -> dict[str, str]:
    """HTP backend options, every one explicit:

    - fp16 precision: float graphs run in fp16 on the HTP (its native float type);
    - the performance mode (`--npu-performance`): voltage and clock votes; `auto` is `burst` on mains
      power and `balanced` on battery, read from the power supply as the worker starts;
    - graph finalization at its most optimized (3): slower to compile, faster to run, and a graph is
      compiled once and cached; in the simulator, whose compile time is all tests wait for, the default.

    Off-device (x86_64) the HTP backend is Qualcomm's simulator, which needs a SoC to model: without
    one it fails to finalize graphs ("QNN_COMMON_ERROR_MEM_ALLOC"). GENIEX_QNN_SOC_MODEL overrides the
    default (60); on a Snapdragon the EP detects the SoC."""
    options = {
        "backend_type": "htp",
        "enable_htp_fp16_precision": "1",
        "htp_performance_mode": performance_mode(performance),
    }
    if qnn.is_simulated():
        options["soc_model"] = os.environ.get("GENIEX_QNN_SOC_MODEL") or "60"
    else:
        options["htp_graph_finalization_optimization_mode"] = "3"
        if soc := os.environ.get("GENIEX_QNN_SOC_MODEL"):
            options["soc_model"] = soc
    return options


def performance_mode(setting: str, power_supplies: Path = POWER_SUPPLIES) -> str:
    """`auto` resolved by the power source: `balanced` on battery, else `burst`; any other setting as it is."""
    if setting != "auto":
        return setting
    return "balanced" if on_battery(power_supplies) else "burst"


def spinning(setting: str, power_supplies: Path = POWER_SUPPLIES) -> bool:
    """`--npu-spinning` resolved: whether QNN sessions' thread pools spin. `mains`: unless on battery."""
    if setting == "mains":
        return not on_battery(power_supplies)
    return setting == "on"


def spinning_at_start(setting: str) -> bool:
    """`spinning` for a worker about to make its QNN sessions: resolved once, as it starts (a laptop
    unplugged later keeps the choice until its worker is restarted), and logged."""
    spin = spinning(setting)
    log.info("npu thread spinning", setting=setting, spinning=spin)
    return spin


def allow_spinning(so: ort.SessionOptions, spin: bool) -> None:
    """Whether both of onnxruntime's thread pools spin, busy-waiting for work between tasks, or sleep:
    the intra-op pool (one node's threads) and the inter-op pool (parallel nodes; unused while
    inter_op_num_threads is 1, but onnxruntime spins by default, so it is set too). Spinning answers
    a little sooner and costs whole cores (docs/accelerators.md)."""
    value = "1" if spin else "0"
    so.add_session_config_entry("session.intra_op.allow_spinning", value)
    so.add_session_config_entry("session.inter_op.allow_spinning", value)


def skel_library_dir() -> str | None:
    """The folder of the QNN wheel's Hexagon skel libraries (the code FastRPC loads onto the NPU),
    for ADSP_LIBRARY_PATH; None where the wheel carries none (the simulator's)."""
    import onnxruntime_qnn

    root = Path(onnxruntime_qnn.get_library_path()).parent
    found = sorted(root.rglob("libQnnHtpV*Skel.so"))
    return str(found[0].parent) if found else None


_qnn_registered = False


def register_qnn() -> list[Any]:
    """Register the onnxruntime-qnn plugin once; its devices, or EngineError when it is absent."""
    global _qnn_registered
    try:
        import onnxruntime_qnn
    except ImportError:
        raise EngineError(
            "compute npu needs the onnxruntime-qnn package, which is not installed", kind=ErrorKind.ENGINE
        ) from None
    if not _qnn_registered:
        # FastRPC finds the skel libraries through ADSP_LIBRARY_PATH, read when QNN first opens the
        # NPU: the wheel's own, unless the operator set it (a Qualcomm SDK installed elsewhere).
        if not qnn.is_simulated() and not os.environ.get("ADSP_LIBRARY_PATH") and (skel := skel_library_dir()):
            os.environ["ADSP_LIBRARY_PATH"] = skel
        ort.register_execution_provider_library(QNN, onnxruntime_qnn.get_library_path())
        _qnn_registered = True
    devices = [d for d in ort.get_ep_devices() if d.ep_name == QNN]
    if not devices:
        raise EngineError("onnxruntime-qnn is installed but reports no QNN device", kind=ErrorKind.ENGINE)
    return devices


def npu_devices() -> tuple[list[Any], str | None]:
    """The QNN devices a session can run on, or ([], why not): the simulator rule first
    (protocol/qnn.py: no NPU here, and the simulator not enabled), then the plugin itself."""
    if (why := qnn.unavailable_reason()) is not None:
        return [], why
    try:
        return register_qnn(), None
    except EngineError as exc:
        return [], exc.message


def nodes_by_provider(profile_file: str) -> dict[str, int]:
    """Graph nodes per execution provider in an onnxruntime profile (a QNN partition counts as one)."""
    try:
        events = json.loads(Path(profile_file).read_text())
    except (OSError, ValueError):
        return {}
    seen = {(e["name"], e["args"]["provider"]) for e in events
            if e.get("cat") == "Node" and "provider" in e.get("args", {})}  # fmt: skip
    return dict(Counter(provider for _, provider in seen))


def bucket(n: int, sizes: tuple[int, ...]) -> int:
    return next((s for s in sizes if s >= n), sizes[-1])


class OnnxEngine(QueuedEngine):
    name = "onnx"
    serves = (Embed, Rerank)

    def __init__(self, opts: EngineOptions) -> None:
        t0 = time.perf_counter()
        self.npu_performance = opts.npu_performance
        self.npu_spinning = opts.npu_spinning
        self._spin = False  # whether its QNN sessions spin: resolved when the NPU is chosen
        self.folder, self.model_file = model_files(opts.model_path)
        if not self.model_file.is_file():
            raise EngineError(f"{self.model_file} does not exist", kind=ErrorKind.ENGINE)
        tok_file = self.folder / "tokenizer.json"
        if not tok_file.is_file():
            raise EngineError(
                f"{tok_file} does not exist: an ONNX model needs its tokenizer.json", kind=ErrorKind.ENGINE
            )
        self.tokenizer = Tokenizer.from_file(str(tok_file))
        padding = self.tokenizer.padding
        self.pad_id = padding["pad_id"] if padding else self.tokenizer.token_to_id("[PAD]") or 0
        self.tokenizer.no_padding()  # batches are padded here, to the batch's (or the bucket's) length
        self.tokenizer.no_truncation()  # an over-long input is refused, not silently cut
        self.n_vocab = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.pooling = pooling_mode(self.folder)
        self.max_len = max_length(self.folder, opts.nctx)
        self.threads = opts.threads or psutil.cpu_count(logical=False) or os.cpu_count() or 1
        self.compute = "cpu"
        self.provider = CPU
        self.provider_nodes: dict[str, int] = {}
        self._npu_devices: list[Any] = []
        self._npu_sessions: OrderedDict[tuple[int, int], ort.InferenceSession] = OrderedDict()
        self._dims: tuple[str, str] | None = None

        self.session = self._cpu_session()
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output, self.cross_encoder = self._choose_output(self.session)
        if opts.compute == "npu":
            self._start_npu()
        probe = self._probe()
        self.n_embd = 0 if self.cross_encoder else probe.shape[1]
        max_batch = NPU_BATCHES[-1] if self.compute == "npu" else CPU_BATCH
        self.queue = EmbeddingQueue(self._forward, n_embd=self.n_embd, max_batch=max_batch,
                                    cross_encoder=self.cross_encoder)  # fmt: skip
        self.load_seconds = time.perf_counter() - t0
        log.info("onnx model loaded", model=str(self.model_file), provider=self.provider, nodes=self.provider_nodes,
                 pooling=self.pooling, max_len=self.max_len, cross_encoder=self.cross_encoder,
                 n_embd=self.n_embd)  # fmt: skip

    # ---- sessions ----------------------------------------------------------

    def _options(self, spin: bool = False) -> ort.SessionOptions:
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3  # onnxruntime's warnings about fusions are noise in a service log
        # Workers share the cores: a CPU pool spinning between passes would slow the others down; a
        # QNN session spins only as `--npu-spinning` says.
        allow_spinning(so, spin)
        return so

    def _cpu_session(self) -> ort.InferenceSession:
        return ort.InferenceSession(str(self.model_file), sess_options=self._options(), providers=[CPU])

    def _npu_session(self, batch: int, length: int, profile_dir: str | None = None) -> ort.InferenceSession:
        so = self._options(self._spin)
        if self._dims is not None:
            so.add_free_dimension_override_by_name(self._dims[0], batch)
            so.add_free_dimension_override_by_name(self._dims[1], length)
        if profile_dir is not None:
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(profile_dir, "probe")
        so.add_provider_for_devices(self._npu_devices[:1], qnn_options(self.npu_performance))
        return ort.InferenceSession(str(self.model_file), sess_options=so)

    def _start_npu(self) -> None:
        """Switch to QNN if it takes the model; otherwise stay on the CPU, and say why."""
        self._npu_devices, why = npu_devices()
        if why is not None:
            log.warning("npu unavailable; running on cpu", reason=why)
            return
        first = self.session.get_inputs()[0].shape
        if len(first) == 2 and all(isinstance(d, str) for d in first):
            self._dims = (first[0], first[1])
        else:
            log.warning("model inputs have no named batch/sequence dimensions; QNN gets dynamic shapes", shape=first)
        self.compute = "npu"
        self._spin = spinning_at_start(self.npu_spinning)

    def _probe(self) -> np.ndarray:
        """One forward pass at load: a warm-up, the output width, and (NPU) which provider ran what."""
        text = ("query", "document") if self.cross_encoder else "probe"
        enc = self.tokenizer.encode(*text) if isinstance(text, tuple) else self.tokenizer.encode(text)
        seq = Seq(enc.ids, enc.type_ids if self.cross_encoder else None)
        if self.compute != "npu":
            return self._forward([seq], self.cross_encoder)
        profile_dir = tempfile.mkdtemp(prefix="geniex-ort-")
        try:
            length = bucket(len(seq.ids), self._lengths())
            session = self._npu_session(1, length, profile_dir)
            self._npu_sessions[(1, length)] = session
            out = self._run(session, [seq], self.cross_encoder, 1, length)
            self.provider_nodes = nodes_by_provider(session.end_profiling())
        except Exception as exc:  # noqa: BLE001 - the NPU refused the model: run it on the CPU instead
            log.warning("QNN could not run the model; running on cpu", error=f"{type(exc).__name__}: {exc}")
            self._npu_sessions.clear()
            self.compute = "cpu"
            return self._forward([seq], self.cross_encoder)
        finally:
            shutil.rmtree(profile_dir, ignore_errors=True)
        if self.provider_nodes.get(QNN, 0) == 0:
            log.warning("QNN took no part of the model; running on cpu", nodes=self.provider_nodes)
            self._npu_sessions.clear()
            self.compute = "cpu"
            return self._forward([seq], self.cross_encoder)
        self.provider = QNN
        return out

    def _lengths(self) -> tuple[int, ...]:
        sizes, n = [], NPU_MIN_LEN
        while n < self.max_len:
            sizes.append(n)
            n *= 2
        sizes.append(self.max_len)
        return tuple(sizes)

    @staticmethod
    def _choose_output(session: ort.InferenceSession) -> tuple[str, bool]:
        outputs = {o.name: o for o in session.get_outputs()}
        if "sentence_embedding" in outputs:
            return "sentence_embedding", False
        if "logits" in outputs and len(outputs["logits"].shape) == 2:
            return "logits", True
        for name in (*HIDDEN_OUTPUTS, *outputs):
            if name in outputs and len(outputs[name].shape) in (2, 3):
                return name, False
        raise EngineError(
            f"no output of this ONNX model is an embedding or a score: {list(outputs)}", kind=ErrorKind.ENGINE
        )

    # ---- forward -----------------------------------------------------------

    def _forward(self, seqs: list[Seq], pairs: bool) -> np.ndarray:
        longest = max(len(s.ids) for s in seqs)
        if self.compute != "npu":
            return self._run(self.session, seqs, pairs, len(seqs), longest)
        batch, length = bucket(len(seqs), NPU_BATCHES), bucket(longest, self._lengths())
        key = (batch, length)
        session = self._npu_sessions.get(key)
        if session is None:
            t0 = time.perf_counter()
            session = self._npu_session(batch, length)
            log.info("compiled an npu shape", batch=batch, length=length, seconds=round(time.perf_counter() - t0, 3))
            self._npu_sessions[key] = session
            while len(self._npu_sessions) > NPU_SESSIONS:
                self._npu_sessions.popitem(last=False)
        self._npu_sessions.move_to_end(key)
        return self._run(session, seqs, pairs, batch, length)

    def _run(self, session: ort.InferenceSession, seqs: list[Seq], pairs: bool, batch: int, length: int) -> np.ndarray:
        """One session.run over `seqs` padded to [batch, length]; one output row per sequence."""
        ids = np.full((batch, length), self.pad_id, dtype=np.int64)
        mask = np.zeros((batch, length), dtype=np.int64)
        types = np.zeros((batch, length), dtype=np.int64)
        for i, s in enumerate(seqs):
            n = len(s.ids)
            ids[i, :n] = s.ids
            mask[i, :n] = 1
            if s.type_ids is not None:
                types[i, :n] = s.type_ids
        mask[len(seqs) :, 0] = 1  # padding rows: one visible token, so no row divides by zero
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        (out,) = session.run([self.output], {name: feed[name] for name in self.input_names if name in feed})
        out = out[: len(seqs)]
        if out.ndim == 3:
            out = pool(out, mask[: len(seqs)], self.pooling)
        return np.asarray(out, dtype=np.float32)

    # ---- Engine interface --------------------------------------------------

    def ready(self) -> Ready:
        nodes = ", ".join(f"{p}: {n}" for p, n in sorted(self.provider_nodes.items()))
        return Ready(
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            engine=self.name,
            compute=self.compute,
            n_ctx=self.max_len,
            n_ctx_train=self.max_len,
            n_vocab=self.n_vocab,
            parallel=1,
            model_bytes=sum(f.stat().st_size for f in self.folder.iterdir() if f.is_file()),
            load_seconds=round(self.load_seconds, 3),
            description=f"ONNX {'cross-encoder' if self.cross_encoder else 'embedding'} model"
            + (f"; graph nodes per provider: {nodes}" if nodes else ""),
            provider=self.provider,
            n_embd=self.n_embd,
        )

    def submit(self, req: Embed | Rerank) -> None:
        if isinstance(req, Embed):
            seqs = self._embed_inputs(req)
            seqs = cut_to(seqs, self.max_len) if req.truncate else seqs
            check_lengths(seqs, self.max_len)
            self.queue.submit_embed(req, seqs)
            return
        if self.cross_encoder:
            # A query too long for the model is refused once, before it is paired with every document.
            check_lengths([Seq(self.tokenizer.encode(req.query).ids)], self.max_len, "query")
            pairs = self.tokenizer.encode_batch([(req.query, d) for d in req.documents])
            seqs = [Seq(e.ids, e.type_ids) for e in pairs]
            check_lengths(seqs, self.max_len, "documents")
        else:
            seqs = [Seq(e.ids) for e in self.tokenizer.encode_batch([req.query, *req.documents])]
            check_lengths(seqs[:1], self.max_len, "query")
            check_lengths(seqs[1:], self.max_len, "documents")
        self.queue.submit_rerank(req, seqs)

    def _embed_inputs(self, req: Embed) -> list[Seq]:
        if req.token_ids is not None:
            check_token_ids(req.token_ids, self.n_vocab)
            return [Seq(list(row)) for row in req.token_ids]
        return [Seq(e.ids) for e in self.tokenizer.encode_batch(req.texts or [])]

    def set_threads(self, n: int) -> None:
        pass  # onnxruntime fixes a session's threads when it is created; spinning is off instead

    # ---- tokens (/tokenize, /detokenize) ------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        # The tokenizers library always reads its added (special) tokens in text.
        return list(self.tokenizer.encode(text, add_special_tokens=add_special).ids)

    def pieces(self, tokens: list[int]) -> list[bytes]:
        return [(self.tokenizer.id_to_token(t) or "").encode() for t in tokens]

    def detokenize(self, tokens: list[int]) -> bytes:
        n_vocab = self.tokenizer.get_vocab_size(with_added_tokens=True)
        bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise EngineError(f"`tokens`: token id {bad} is not in the vocabulary (0..{n_vocab - 1})")
        return self.tokenizer.decode(tokens, skip_special_tokens=False).encode()

    def close(self) -> None:
        self._npu_sessions.clear()


def load(opts: EngineOptions) -> OnnxEngine:
    return OnnxEngine(opts)
