"""Text to image with a `diffusers` pipeline on torch, on the CPU.

A model is a diffusers folder, as `geniex pull --local DIR` stores it: `model_index.json` and one
folder per component (unet or transformer, vae, text encoder(s), tokenizer(s), scheduler), with
safetensors weights. `DiffusionPipeline` loads the pipeline class model_index.json names (Stable
Diffusion 1.x/2.x, SDXL, ...); one whose call does not make images from text is refused. The
worker never reaches a hub: HF_HUB_OFFLINE is set before diffusers is imported and every load is
`local_files_only`; pickled weights are never read (`use_safetensors`).

A request's images are made one after another, each with its own generator (`seed + i`), on one
long-lived thread: the worker's loop stays free to read a Cancel while a step runs, and the
pipeline's `callback_on_step_end` checks for it after every denoising step, so a client that
leaves stops the work within a step. The same callback logs progress (a line every few seconds)
and applies a new thread count from the gateway.
"""

from __future__ import annotations

import inspect
import io
import os
import queue
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import structlog

from protocol.wire import PROTOCOL_VERSION, Done, ErrorKind, Failed, FromWorker, GenerateImages, Images, Ready
from workers.engines import Emit, EngineError, EngineOptions

log = structlog.get_logger("worker.diffusion")

STEP_WAIT_S = 0.05  # how long `step` waits for the image thread before the loop reads commands again
PROGRESS_LOG_S = 5.0  # at most one progress line this often (and one per image at its end)
MAX_SEED = 2**63 - 1
# What a pipeline's call must take to serve a request: a text-to-image pipeline (an img2img or
# inpainting one also wants an image, and is refused at load).
TEXT_TO_IMAGE = {"prompt", "negative_prompt", "height", "width", "num_inference_steps", "guidance_scale",
                 "num_images_per_prompt", "generator", "callback_on_step_end", "output_type"}  # fmt: skip


def _libraries() -> tuple[ModuleType, Any]:
    """(torch, DiffusionPipeline), imported when the engine loads, in the worker: the environment
    they read once at import is set first, and no other process that merely imports this module
    (a test of the engine registry) has its environment changed."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # the server never downloads (README: `geniex pull`)
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    # OpenMP threads that spin while they wait for work collapse when another program holds a
    # core: on a busy 2-core box a tiny UNet step took 2.3 s with spinning threads, 0.12 s without.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    from diffusers import DiffusionPipeline
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.disable_progress_bar()  # its bars would fill the server log, one per load
    return torch, DiffusionPipeline


class _Cancelled(Exception):
    """Raised from the step callback to leave the pipeline at once (its own `interrupt` flag
    would still run the VAE decode)."""


@dataclass
class _Job:
    req: GenerateImages
    revised_prompt: str
    prompt_tokens: int
    cancelled: threading.Event = field(default_factory=threading.Event)


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


class DiffusionEngine:
    name = "diffusers"
    serves = (GenerateImages,)

    def __init__(self, opts: EngineOptions) -> None:
        t0 = time.perf_counter()
        self.folder = Path(opts.model_path)
        if not (self.folder / "model_index.json").is_file():
            raise EngineError(f"{self.folder} is not a diffusers model (no model_index.json)", kind=ErrorKind.ENGINE)
        self.compute = "cpu"
        self.threads = opts.threads or psutil.cpu_count(logical=False) or os.cpu_count() or 1
        self.torch, pipeline_class = _libraries()
        torch = self.torch
        torch.set_num_threads(self.threads)
        try:
            self.pipe: Any = pipeline_class.from_pretrained(
                str(self.folder), local_files_only=True, use_safetensors=True, dtype=torch.float32
            )
        except (OSError, ValueError, TypeError, KeyError, AttributeError, ImportError) as exc:
            raise EngineError(f"cannot load the diffusers pipeline in {self.folder}: {exc}",
                              kind=ErrorKind.ENGINE) from exc  # fmt: skip
        missing = TEXT_TO_IMAGE - set(inspect.signature(self.pipe.__call__).parameters)
        if missing:
            raise EngineError(f"{type(self.pipe).__name__} does not make images from text (its call takes no "
                              f"{', '.join(sorted(missing))})", kind=ErrorKind.ENGINE)  # fmt: skip
        self.pipe.set_progress_bar_config(disable=True)
        # Height and width must be multiples of the VAE's scale (8 for SD); the spec's sizes are.
        self.multiple = int(getattr(self.pipe, "vae_scale_factor", 8) or 8)
        self.tokenizer = getattr(self.pipe, "tokenizer", None)
        self.max_tokens = int(getattr(self.tokenizer, "model_max_length", 0) or 0)
        self.load_seconds = time.perf_counter() - t0
        self.waiting: deque[_Job] = deque()
        self.running: _Job | None = None
        self._inbox: queue.Queue[_Job | None] = queue.Queue()
        self._results: queue.Queue[FromWorker] = queue.Queue()
        self._applied_threads = self.threads
        self._thread = threading.Thread(target=self._serve_jobs, name="images", daemon=True)
        self._thread.start()
        log.info("pipeline loaded", pipeline=type(self.pipe).__name__, seconds=round(self.load_seconds, 3))

    # ---- the Engine interface (the worker's thread) --------------------------------------

    def ready(self) -> Ready:
        parts = ", ".join(f"{k}: {type(v).__name__}" for k, v in self.pipe.components.items() if v is not None)
        return Ready(
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            engine=self.name,
            compute=self.compute,
            n_ctx=self.max_tokens,
            n_ctx_train=self.max_tokens,
            n_vocab=len(self.tokenizer) if self.tokenizer is not None else 0,
            parallel=1,
            model_bytes=_folder_bytes(self.folder),
            load_seconds=round(self.load_seconds, 3),
            description=f"diffusers {type(self.pipe).__name__} ({parts})",
            provider=f"torch {self.torch.__version__} CPU",
        )

    def submit(self, req: GenerateImages) -> None:
        for name, value in (("width", req.width), ("height", req.height)):
            if value < self.multiple or value % self.multiple:
                raise EngineError(f"`size`: the {name} must be a multiple of {self.multiple} for this model")
        if req.n < 1 or req.steps < 1:
            raise EngineError("`n` and the step count must be at least 1")
        revised, tokens = self._read_prompt(req.prompt)
        self.waiting.append(_Job(req, revised, tokens))

    def cancel(self, req_id: int, emit: Emit) -> None:
        for job in self.waiting:
            if job.req.req_id == req_id:
                self.waiting.remove(job)
                emit(Done(req_id, "cancelled"))
                return
        if self.running is not None and self.running.req.req_id == req_id:
            self.running.cancelled.set()  # its Done comes from `step` once the thread has stopped

    def has_work(self) -> bool:
        return self.running is not None or bool(self.waiting)

    def step(self, emit: Emit) -> None:
        """Start the next request if none runs, then wait a moment for the running one to end."""
        if self.running is None and self.waiting:
            self.running = self.waiting.popleft()
            self._inbox.put(self.running)
        try:
            result = self._results.get(timeout=STEP_WAIT_S)
        except queue.Empty:
            return
        self.running = None
        emit(result)

    def set_threads(self, n: int) -> None:
        self.threads = max(1, n)  # applied by the image thread at its next step

    def idle(self) -> None:
        pass

    def close(self) -> None:
        if self.running is not None:
            self.running.cancelled.set()
        self._inbox.put(None)
        self._thread.join(timeout=10)

    # ---- the image thread ------------------------------------------------------------------

    def _read_prompt(self, prompt: str) -> tuple[str, int]:
        """(the prompt the text encoder reads, its token count). CLIP reads 77 tokens; a longer
        prompt is cut, and `revised_prompt` then says what was kept."""
        if self.tokenizer is None or not self.max_tokens:
            return prompt, 0
        ids = self.tokenizer(prompt, truncation=False, add_special_tokens=True).input_ids
        if len(ids) <= self.max_tokens:
            return prompt, len(ids)
        kept = ids[: self.max_tokens - 1]
        return self.tokenizer.decode(kept, skip_special_tokens=True), self.max_tokens

    def _serve_jobs(self) -> None:
        while (job := self._inbox.get()) is not None:
            try:
                result: FromWorker = self._generate(job)
            except _Cancelled:
                log.info("image generation cancelled", req_id=job.req.req_id)
                result = Done(job.req.req_id, "cancelled")
            except Exception as exc:
                log.exception("image generation failed", error=repr(exc))
                result = Failed(
                    job.req.req_id, ErrorKind.ENGINE, f"image generation failed: {type(exc).__name__}: {exc}"
                )
            self._results.put(result)

    def _set_threads(self) -> None:
        # torch's thread count is per calling thread (OpenMP), so this thread sets its own.
        if self._applied_threads != self.threads or self.torch.get_num_threads() != self.threads:
            self.torch.set_num_threads(self.threads)
            self._applied_threads = self.threads

    def _generate(self, job: _Job) -> Images:
        req = job.req
        seed = req.seed if req.seed is not None else secrets.randbelow(MAX_SEED - req.n)
        t0 = last_log = time.perf_counter()
        pngs: list[bytes] = []
        self._set_threads()
        for i in range(req.n):
            t_image = time.perf_counter()

            def on_step(pipe: Any, step: int, timestep: Any, kwargs: dict[str, Any], i: int = i) -> dict[str, Any]:
                nonlocal last_log
                if job.cancelled.is_set():
                    raise _Cancelled
                self._set_threads()
                now = time.perf_counter()
                if now - last_log >= PROGRESS_LOG_S:
                    last_log = now
                    log.info("image progress", req_id=req.req_id, image=i + 1, images=req.n, step=step + 1,
                             steps=req.steps, seconds=round(now - t0, 1))  # fmt: skip
                return kwargs

            out = self.pipe(
                prompt=req.prompt,  # the pipeline cuts it as `revised_prompt` says
                negative_prompt=req.negative_prompt or None,
                num_inference_steps=req.steps,
                guidance_scale=req.guidance,
                height=req.height,
                width=req.width,
                num_images_per_prompt=1,
                generator=self.torch.Generator("cpu").manual_seed(seed + i),
                callback_on_step_end=on_step,
                output_type="pil",
            )
            buf = io.BytesIO()
            out.images[0].save(buf, format="PNG")
            pngs.append(buf.getvalue())
            log.info("image done", req_id=req.req_id, image=i + 1, images=req.n, size=f"{req.width}x{req.height}",
                     steps=req.steps, seconds=round(time.perf_counter() - t_image, 2))  # fmt: skip
            if job.cancelled.is_set():
                raise _Cancelled
        return Images(req.req_id, pngs, job.prompt_tokens, job.revised_prompt, round(time.perf_counter() - t0, 3))


def load(opts: EngineOptions) -> DiffusionEngine:
    return DiffusionEngine(opts)
