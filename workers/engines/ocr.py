"""OCR: PP-OCR text detection, orientation and recognition, on our onnxruntime sessions.

A model is a folder of PP-OCR ONNX graphs (the bundled one is the `models` folder of the `rapidocr`
wheel): a detector (`*det*.onnx`), a recogniser (`*rec*.onnx`, its character dictionary in the
graph's metadata or in a `*.txt` beside it) and optionally a text-orientation classifier
(`*cls*.onnx`).

The pre- and post-processing is RapidOCR's, not ours: image scaling and padding, DB text-detection
post-processing (binarise, contours, unclip), reading-order box sorting, crop and rotate, the 0/180
classifier, CTC decoding against the dictionary, and mapping boxes back to the image. Its `RapidOCR`
pipeline builds its three parts lazily, each on an `OrtInferSession` that takes a ready
`InferenceSession` from its config (`session`, RapidOCR PR #451, the way immich uses it). So this
engine opens the sessions itself (CPU, or the QNN execution provider for `compute: npu`, as the
ONNX engine does), builds RapidOCR's `TextDetector`, `TextClassifier` and `TextRecognizer` on
them, and sets them on the pipeline before its first call: RapidOCR never opens a model file,
never downloads one, and never reads an image from a path or URL (it is handed decoded pixels).

Images are decoded here with Pillow, from a few common formats only, after the header's size is
checked against MAX_IMAGE_PIXELS and the aspect ratio bounds (protocol/cv.py); a bad image is a 400.

NPU: QNN's HTP backend wants static shapes, and these graphs take any image size (the detector)
and any line width (the recogniser). The worker offers each graph to QNN, runs a probe image at
load, and keeps QNN for a graph only if QNN ran part of it (onnxruntime's node profile); otherwise
it runs on the CPU and the log and Ready.description say so.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import psutil
import structlog
from omegaconf import DictConfig, OmegaConf
from PIL import Image, ImageDraw, ImageOps
from rapidocr import RapidOCR
from rapidocr.ch_ppocr_cls import TextClassifier
from rapidocr.ch_ppocr_det import TextDetector
from rapidocr.ch_ppocr_rec import TextRecognizer
from rapidocr.utils.output import RapidOCROutput

from protocol.cv import MAX_IMAGE_PIXELS, MAX_TALL_RATIO, MAX_WIDE_RATIO
from protocol.wire import PROTOCOL_VERSION, Done, ErrorKind, Failed, Ready, Recognize, TextRegion, TextRegions
from workers.engines import Emit, EngineError, EngineOptions
from workers.engines.onnx import (
    CPU,
    QNN,
    allow_spinning,
    nodes_by_provider,
    npu_devices,
    qnn_options,
    spinning_at_start,
)

log = structlog.get_logger("worker.ocr")

# The formats a request's image may be in. Pillow knows dozens more; some hand the bytes to other
# programs (EPS to Ghostscript) or to rarely exercised decoders, so the rest are refused.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
PARTS = ("det", "cls", "rec")  # detector, orientation classifier, recogniser (the graph files' tags)


def model_graphs(folder: Path) -> dict[str, Path]:
    """The folder's graph for each part: `*det*.onnx`, `*rec*.onnx` (both required), `*cls*.onnx`."""
    if not folder.is_dir():
        raise EngineError(f"{folder} is not a folder of PP-OCR ONNX models", kind=ErrorKind.ENGINE)
    graphs: dict[str, Path] = {}
    for part in PARTS:
        found = sorted(p for p in folder.glob("*.onnx") if part in p.stem.lower())
        if len(found) > 1:
            raise EngineError(f"{folder} holds several {part} models: {', '.join(p.name for p in found)}",
                              kind=ErrorKind.ENGINE)  # fmt: skip
        if found:
            graphs[part] = found[0]
    missing = [p for p in ("det", "rec") if p not in graphs]
    if missing:
        raise EngineError(f"{folder} has no {' and no '.join(missing)} model (*det*.onnx, *rec*.onnx)",
                          kind=ErrorKind.ENGINE)  # fmt: skip
    return graphs


def decode_image(data: bytes) -> Image.Image:
    """The request's image as RGB or RGBA pixels, upright as its EXIF says; EngineError (a 400) for
    anything that is not a whole image of an allowed format within the bounds."""
    if not data:
        raise EngineError("`image` is empty")
    try:
        file = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except Image.DecompressionBombError as exc:
        raise EngineError(f"`image` is too large: {exc}") from None
    except Exception:  # noqa: BLE001 - Pillow raises many kinds for bytes it cannot read
        raise EngineError(f"`image` could not be read as an image ({', '.join(IMAGE_FORMATS)})") from None
    width, height = file.size
    if width < 1 or height < 1:
        raise EngineError("`image` has no pixels")
    if width * height > MAX_IMAGE_PIXELS:
        raise EngineError(f"`image` is {width}x{height} pixels; at most {MAX_IMAGE_PIXELS:,} pixels are read")
    if width > MAX_WIDE_RATIO * height or height > MAX_TALL_RATIO * width:
        raise EngineError(f"`image` is {width}x{height} pixels; it may be at most {MAX_WIDE_RATIO} times as wide "
                          f"as it is high and {MAX_TALL_RATIO} times as high as it is wide: split it")  # fmt: skip
    try:
        file.load()
        img = ImageOps.exif_transpose(file)
        # RapidOCR blends an alpha channel onto a background that contrasts with the text; every
        # other mode (palette, 16-bit, CMYK, ...) becomes RGB, which it reads as RGB.
        transparent = "A" in img.getbands() or "transparency" in img.info
        return img.convert("RGBA" if transparent else "RGB")
    except Exception as exc:  # noqa: BLE001 - truncated or corrupt data fails here, not at open
        raise EngineError(f"`image` could not be decoded: {type(exc).__name__}: {exc}") from None


def text_regions(req_id: int, width: int, height: int, out: Any) -> TextRegions:
    """RapidOCR's answer (quadrilaterals, texts, scores, in reading order) as axis-aligned boxes."""
    if not isinstance(out, RapidOCROutput) or out.boxes is None or out.txts is None or out.scores is None:
        return TextRegions(req_id, width, height, [])
    regions = []
    for quad, text, score in zip(np.asarray(out.boxes, dtype=np.float64), out.txts, out.scores):
        x0, y0 = (max(0.0, float(v)) for v in quad.min(axis=0))
        x1, y1 = float(min(quad[:, 0].max(), width)), float(min(quad[:, 1].max(), height))
        regions.append(TextRegion(str(text), round(float(score), 4), round(x0, 1), round(y0, 1),
                                  round(x1 - x0, 1), round(y1 - y0, 1)))  # fmt: skip
    return TextRegions(req_id, width, height, regions)


def probe_image() -> Image.Image:
    """A synthetic image for the load-time probe (a warm-up, and which provider ran what): dark
    bars on white, enough for the detector to find regions and the recogniser to read them."""
    img = Image.new("RGB", (160, 160), "white")  # square: the detector's smallest canvas, 736 x 736
    draw = ImageDraw.Draw(img)
    for y in (40, 100):
        draw.rectangle((20, y, 140, y + 20), fill="black")
    return img


@dataclass
class Part:
    """One graph of the pipeline and what runs it."""

    name: str
    path: Path
    session: ort.InferenceSession
    provider: str = CPU
    nodes: dict[str, int] | None = None


class OcrEngine:
    name = "ocr"
    serves = (Recognize,)

    def __init__(self, opts: EngineOptions) -> None:
        t0 = time.perf_counter()
        self.folder = Path(opts.model_path)
        self.npu_performance = opts.npu_performance
        self.npu_spinning = opts.npu_spinning
        self._spin = False  # whether its QNN sessions spin: resolved when the NPU is chosen
        graphs = model_graphs(self.folder)
        self.threads = opts.threads or psutil.cpu_count(logical=False) or os.cpu_count() or 1
        self.compute = "cpu"
        self._npu_devices: list[Any] = []
        self._profile_dir: str | None = None
        if opts.compute == "npu":
            self._start_npu()
        npu = self.compute == "npu"
        self.parts = {name: Part(name, path, self._session(path, npu=npu)) for name, path in graphs.items()}
        self.pipeline = self._pipeline()
        self._probe()
        self.queue: deque[Recognize] = deque()
        self.load_seconds = time.perf_counter() - t0
        log.info("ocr model loaded", folder=str(self.folder), compute=self.compute,
                 providers={p.name: p.provider for p in self.parts.values()})  # fmt: skip

    # ---- sessions ----------------------------------------------------------

    def _options(self, spin: bool = False) -> ort.SessionOptions:
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        allow_spinning(so, spin)  # workers share the cores: only a QNN session may spin (`--npu-spinning`)
        # Every image has its own input shapes: an arena would keep the largest image's activations
        # (about 1 GiB at the bounds) for the worker's life. RapidOCR's own sessions turn it off too.
        so.enable_cpu_mem_arena = False
        return so

    def _session(self, path: Path, *, npu: bool = False) -> ort.InferenceSession:
        so = self._options(spin=npu and self._spin)
        if not npu:
            return ort.InferenceSession(str(path), sess_options=so, providers=[CPU])
        so.enable_profiling = True  # for the probe: which provider ran which node
        so.profile_file_prefix = os.path.join(self._profile_dir or tempfile.gettempdir(), path.stem)
        so.add_provider_for_devices(self._npu_devices[:1], qnn_options(self.npu_performance))
        return ort.InferenceSession(str(path), sess_options=so)

    def _start_npu(self) -> None:
        self._npu_devices, why = npu_devices()
        if why is not None:
            log.warning("npu unavailable; running on cpu", reason=why)
            return
        self._profile_dir = tempfile.mkdtemp(prefix="geniex-ocr-")
        self.compute = "npu"
        self._spin = spinning_at_start(self.npu_spinning)

    def _pipeline(self) -> RapidOCR:
        """RapidOCR with its three parts built on our sessions (its defaults for everything else)."""
        # Its log lines are plain text on stderr, and its warnings are about the input ("the text
        # detection result is empty"), which the answer already says: only its errors are logged.
        pipeline = RapidOCR(params={"Global.log_level": "error", "Global.use_cls": "cls" in self.parts})
        cfg = pipeline.cfg
        pipeline.text_det = TextDetector(self._config(cfg.Det, self.parts["det"]))
        if "cls" in self.parts:
            pipeline.text_cls = TextClassifier(self._config(cfg.Cls, self.parts["cls"]))
        rec_cfg = self._config(cfg.Rec, self.parts["rec"])
        rec_cfg.font_path = cfg.Global.font_path
        if not self.parts["rec"].session.get_modelmeta().custom_metadata_map.get("character"):
            keys = sorted(self.folder.glob("*.txt"))
            if len(keys) != 1:
                raise EngineError(f"{self.parts['rec'].path.name} carries no character dictionary, and "
                                  f"{self.folder} has no one *.txt to read it from", kind=ErrorKind.ENGINE)  # fmt: skip
            rec_cfg.rec_keys_path = str(keys[0])
        pipeline.text_rec = TextRecognizer(rec_cfg)
        return pipeline

    @staticmethod
    def _config(section: DictConfig, part: Part) -> DictConfig:
        """A copy of RapidOCR's config section for one part, carrying our session (an object, which
        OmegaConf holds only with `allow_objects`)."""
        cfg = DictConfig(OmegaConf.to_container(section), flags={"allow_objects": True})
        cfg.session = part.session
        cfg.model_path = str(part.path)
        return cfg

    def _probe(self) -> None:
        """One image through the pipeline at load: a warm-up, and (NPU) which provider ran what."""
        try:
            self.pipeline(probe_image())
        except Exception as exc:
            if self.compute != "npu":
                raise EngineError(f"the OCR models failed on a probe image: {type(exc).__name__}: {exc}",
                                  kind=ErrorKind.ENGINE) from exc  # fmt: skip
            log.warning("QNN could not run the OCR models; running on cpu", error=f"{type(exc).__name__}: {exc}")
            self._fall_back(list(self.parts.values()))
            return
        if self.compute != "npu":
            return
        refused = []
        for part in self.parts.values():
            part.nodes = nodes_by_provider(part.session.end_profiling())
            if part.nodes.get(QNN, 0) > 0:
                part.provider = QNN
            else:
                refused.append(part)
        if refused:
            # The usual reason: HTP graphs have static shapes, and these inputs are sized per image.
            log.warning("QNN took no part of some OCR graphs; they run on cpu",
                        graphs={p.name: p.nodes for p in refused})  # fmt: skip
            self._fall_back(refused)
        shutil.rmtree(self._profile_dir or "", ignore_errors=True)

    def _fall_back(self, parts: list[Part]) -> None:
        for part in parts:
            part.session = self._session(part.path)
            part.provider = CPU
        self.compute = "npu" if any(p.provider == QNN for p in self.parts.values()) else "cpu"
        self.pipeline = self._pipeline()
        if self._profile_dir:
            shutil.rmtree(self._profile_dir, ignore_errors=True)

    # ---- Engine interface --------------------------------------------------

    def ready(self) -> Ready:
        graphs = "; ".join(f"{p.name}: {p.path.name} on {p.provider}" + (f" {p.nodes}" if p.nodes else "")
                           for p in self.parts.values())  # fmt: skip
        return Ready(
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            engine=self.name,
            compute=self.compute,
            n_ctx=0,
            parallel=1,
            model_bytes=sum(p.path.stat().st_size for p in self.parts.values()),
            load_seconds=round(self.load_seconds, 3),
            description=f"PP-OCR text detection and recognition ({graphs})",
            provider=QNN if any(p.provider == QNN for p in self.parts.values()) else CPU,
        )

    def submit(self, req: Recognize) -> None:
        if not req.image:
            raise EngineError("`image` is empty")
        self.queue.append(req)

    def cancel(self, req_id: int, emit: Emit) -> None:
        for req in self.queue:
            if req.req_id == req_id:
                self.queue.remove(req)
                emit(Done(req_id, "cancelled"))
                return

    def has_work(self) -> bool:
        return bool(self.queue)

    def step(self, emit: Emit) -> None:
        """One whole image: its size is bounded, so a Cancel waits at most one image's time."""
        req = self.queue.popleft()
        t0 = time.perf_counter()
        try:
            img = decode_image(req.image)
            answer = text_regions(req.req_id, img.width, img.height, self.pipeline(img))
        except EngineError as exc:
            emit(exc.failed(req.req_id))
            return
        except Exception as exc:  # one bad image fails its request, not the worker
            log.exception("ocr failed", request_id=req.log_id)
            emit(Failed(req.req_id, ErrorKind.ENGINE, f"the OCR failed on this image: {type(exc).__name__}: {exc}"))
            return
        log.info("ocr done", request_id=req.log_id, size=f"{img.width}x{img.height}", lines=len(answer.regions),
                 seconds=round(time.perf_counter() - t0, 4))  # fmt: skip
        emit(answer)

    def set_threads(self, n: int) -> None:
        pass  # onnxruntime fixes a session's threads when it is created; spinning is off instead

    def idle(self) -> None:
        pass

    def close(self) -> None:
        self.parts.clear()


def load(opts: EngineOptions) -> OcrEngine:
    return OcrEngine(opts)
