"""Chat on a Genie bundle (Qualcomm AI Hub's export for the Qualcomm AI Runtime): libGenie runs the
bundle's QNN context binaries on the Snapdragon's NPU, and this engine feeds it prompts and streams
its answers.

Threads: Genie's query blocks until the answer ends and calls back once per generated piece, so it
runs on a thread of its own; the worker's loop (workers/server.py) submits, cancels and drains the
replies that thread queues, and no socket is shared. A dialog holds one conversation: requests run
one at a time, in order, the others wait in the queue, and the dialog is reset before each (every
request carries its whole conversation). Stop strings are found here (held back while they may
still be forming); a stop, `max_tokens` or a Cancel ends the query early with GenieDialog_signal.

Where the dialog cannot be made (no NPU, the simulator not enabled, binaries built for another SoC
or QAIRT), the worker still comes up, answers token counts, and refuses generation with a 503 that
says why, instead of dying at load (which the gateway could only report as a crash).
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog
from tokenizers import Tokenizer

from protocol import qnn
from protocol.genie_bundle import BundleError, GenieBundle, loadable_config, read_bundle
from protocol.wire import (
    PROTOCOL_VERSION,
    CountTokens,
    Delta,
    Done,
    ErrorKind,
    Failed,
    Generate,
    Ready,
    Started,
    TokenCount,
)
from workers.engines import Emit, EngineError, EngineOptions
from workers.engines.genie_api import (
    SENTENCE_ABORT,
    WARNING_CONTEXT_EXCEEDED,
    GenieError,
    sampler_settings,
)
from workers.engines.llama.chat_template import ChatTemplate, TemplateError
from workers.engines.llama.text_stream import TextStream
from workers.engines.thread_replies import ThreadReplies

log = structlog.get_logger("worker.qairt")

MAX_TEMPLATE_BYTES = 16 << 20  # tokenizer_config.json: its added tokens can make it large, never this large
# A bundle without a chat template: turns as "Role: text", the model's answer after "Assistant:",
# and a new turn of the user's ending it.
PLAIN_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
PLAIN_STOPS = ("\nUser:", "\nSystem:")


class Dialog(Protocol):
    """What this engine asks of a Genie dialog: genie_api.GenieDialog, or a test's fake."""

    can_abort: bool  # `abort` ends a running query early (GenieDialog_signal)
    can_sample: bool  # `set_sampler` takes effect (the GenieSampler API)

    def query(self, prompt: str, on_piece: Callable[[bytes, int], None]) -> int: ...

    def abort(self) -> None: ...

    def reset(self) -> None: ...

    def set_max_tokens(self, n: int) -> None: ...

    def set_sampler(self, sampler: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


OpenDialog = Callable[[bytes], Dialog]


def open_genie_dialog(config_json: bytes) -> Dialog:
    from workers.engines.genie_api import open_dialog  # libGenie loads only where a dialog is made

    return open_dialog(config_json)


@dataclass
class Job:
    req: Generate
    prompt: str
    prompt_tokens: int
    stream: TextStream
    max_tokens: int  # 0: until the model or the context ends it
    n_gen: int = 0
    finish: str = ""  # set when the engine ends the answer itself: "stop" (a stop string) or "length"
    stop_sequence: str = ""
    cancelled: bool = False


class QairtEngine:
    name = "qairt"
    serves = (Generate, CountTokens)

    def __init__(self, opts: EngineOptions, open_dialog: OpenDialog = open_genie_dialog) -> None:
        t0 = time.perf_counter()
        self.folder = Path(opts.model_path)
        try:
            self.bundle: GenieBundle = read_bundle(self.folder)
        except BundleError as exc:  # the store checked it at import: it changed since
            raise EngineError(str(exc), kind=ErrorKind.ENGINE) from None
        self.n_ctx = self.bundle.context_size or opts.nctx
        self.tokenizer = _tokenizer(self.folder / self.bundle.tokenizer)
        self.template, self.plain = _chat_template(self.folder)
        self.n_vocab = self.tokenizer.get_vocab_size(with_added_tokens=True) if self.tokenizer else 0
        self.dialog: Dialog | None = None
        self.unavailable = ""  # why this worker cannot generate ("" when it can)
        if (why := qnn.unavailable_reason()) is not None:
            self.unavailable = f"Genie bundles run only on a Snapdragon NPU, and {why}"
        else:
            try:
                self.dialog = open_dialog(loadable_config(self.folder))
            except (GenieError, BundleError, OSError) as exc:
                self.unavailable = (f"Genie could not load this bundle ({exc}); it needs a Snapdragon NPU and context "
                                    "binaries built for its SoC and this QAIRT version (the worker's log has "
                                    "Genie's own message)")  # fmt: skip
        if self.unavailable:
            log.error("the Genie bundle cannot run here", reason=self.unavailable, bundle=str(self.folder))
        self.load_seconds = time.perf_counter() - t0
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        # Each unfinished request's job (None: a token count, answered at once)
        self._replies: ThreadReplies[Job | None] = ThreadReplies()
        self._active = self._replies.active
        self._lock = threading.Lock()  # guards `_current`: an abort never reaches the query after it
        self._current: Job | None = None
        self._dirty = False  # the dialog holds a conversation
        self._thread: threading.Thread | None = None
        if self.dialog is not None:
            self._thread = threading.Thread(target=self._serve, name="genie-query", daemon=True)
            self._thread.start()

    # ---- the Engine interface (the worker's thread) ---------------------------

    def ready(self) -> Ready:
        d = self.dialog
        sampling = ("temperature, top-k, top-p and seed per request" if d is not None and d.can_sample
                    else "sampling fixed by the bundle's genie_config.json")  # fmt: skip
        n = len(self.bundle.ctx_bins)
        what = f"Genie bundle, {n} context binar{'y' if n == 1 else 'ies'} on {self.bundle.backend or 'QNN'}"
        status = f"cannot run here: {self.unavailable}" if self.unavailable else sampling
        return Ready(protocol_version=PROTOCOL_VERSION, pid=os.getpid(), engine=self.name, compute="npu",
                     n_ctx=self.n_ctx, n_vocab=self.n_vocab, parallel=1, model_bytes=self.bundle.total_bytes,
                     load_seconds=round(self.load_seconds, 3), chat_template=not self.plain,
                     description=f"{what}; {status}", provider="libGenie" if d is not None else "",
                     tool_format=self.template.tool_format, fallback=self.unavailable)  # fmt: skip

    def submit(self, req: Generate | CountTokens) -> None:
        if isinstance(req, CountTokens):
            if req.images:
                raise EngineError("images are not available on a Genie bundle", kind=ErrorKind.UNSUPPORTED)
            n = self._count(self._render(req.messages, req.template_vars, req.tools))
            self._active[req.req_id] = None
            self._replies.put(TokenCount(req.req_id, n))
            return
        self._refuse_extras(req)
        if req.reasoning_budget >= 0:  # said, not refused: the server's --reasoning-budget reaches every model
            log.info("reasoning budget not applied on a Genie bundle", request_id=req.log_id,
                     reasoning_budget=req.reasoning_budget)  # fmt: skip
        if self.dialog is None:
            raise EngineError(f"this model cannot generate here: {self.unavailable}", kind=ErrorKind.OVERLOADED)
        if req.messages is not None:
            prompt = self._render(req.messages, req.template_vars, req.tools)
            stops = [*req.stop, *(PLAIN_STOPS if self.plain else ())]
        else:
            prompt, stops = req.prompt or "", list(req.stop)
        if not prompt:
            raise EngineError("the prompt is empty")
        n_prompt = self._count(prompt)
        if n_prompt >= self.n_ctx:
            raise EngineError(f"the prompt is {n_prompt} tokens, but the bundle's context is {self.n_ctx}; shorten it",
                              code="context_length_exceeded")  # fmt: skip
        job = Job(req, prompt, n_prompt, TextStream(stops), max_tokens=req.max_tokens or 0)
        self._active[req.req_id] = job
        self._jobs.put(job)

    def cancel(self, req_id: int, emit: Emit) -> None:
        if req_id not in self._active:
            return
        job = self._active.pop(req_id)
        if job is None:  # a token count, answered already or about to be: its reply is dropped
            emit(Done(req_id, "cancelled"))
            return
        job.cancelled = True
        with self._lock:
            if self._current is job and self.dialog is not None:
                self.dialog.abort()  # the query returns at its next token
        emit(Done(req_id, "cancelled", prompt_tokens=job.prompt_tokens, completion_tokens=job.n_gen))

    def has_work(self) -> bool:
        return self._replies.pending()

    def step(self, emit: Emit) -> None:
        self._replies.drain(emit, wait=any(j is not None for j in self._active.values()))

    def set_threads(self, n: int) -> None:
        pass  # the NPU does the work; Genie's few host threads are the bundle's `n-threads`

    def idle(self) -> None:
        pass

    def close(self) -> None:
        self._jobs.put(None)
        if self._thread is not None:
            with self._lock:
                if self._current is not None and self.dialog is not None:
                    self.dialog.abort()
            self._thread.join(timeout=30)
        if self.dialog is not None and (self._thread is None or not self._thread.is_alive()):
            try:
                self.dialog.close()
            except GenieError as exc:
                log.warning("freeing the Genie dialog failed", error=str(exc))
        self.dialog = None

    # ---- tokens and prompts ---------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        # The tokenizers library always reads its added (special) tokens in text.
        return list(self._tok().encode(text, add_special_tokens=add_special).ids)

    def pieces(self, tokens: list[int]) -> list[bytes]:
        tok = self._tok()
        return [(tok.id_to_token(t) or "").encode() for t in tokens]

    def detokenize(self, tokens: list[int]) -> bytes:
        tok = self._tok()
        bad = next((t for t in tokens if not 0 <= t < self.n_vocab), None)
        if bad is not None:
            raise EngineError(f"`tokens`: token id {bad} is not in the vocabulary (0..{self.n_vocab - 1})")
        return tok.decode(tokens, skip_special_tokens=False).encode()

    def _tok(self) -> Tokenizer:
        if self.tokenizer is None:
            raise EngineError(f"the bundle's {self.bundle.tokenizer} cannot be read by the tokenizers package",
                              kind=ErrorKind.UNSUPPORTED)  # fmt: skip
        return self.tokenizer

    def _count(self, text: str) -> int:
        """The prompt's tokens as the tokenizers package counts them (0 without a readable tokenizer)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids) if self.tokenizer else 0

    def _render(self, messages: list[dict[str, Any]], variables: dict[str, Any],
                tools: list[dict[str, Any]] | None) -> str:  # fmt: skip
        try:
            return self.template.render(_text_only(messages), variables, tools)
        except TemplateError as exc:
            raise EngineError(f"`messages`: {exc}") from exc

    @staticmethod
    def _refuse_extras(req: Generate) -> None:
        """What Genie's dialog cannot do, refused (400) rather than silently ignored."""
        constraint = f"`{req.constraint.field or 'grammar'}` (constrained output)" if req.constraint else ""
        unsupported = [("images", bool(req.images)), ("`suffix` (fill in the middle)", req.suffix is not None),
                       ("speculative decoding", req.speculation is not None), ("`logprobs`", req.logprobs >= 0),
                       ("`logit_bias`", bool(req.logit_bias)), (constraint, req.constraint is not None)]  # fmt: skip
        what = next((name for name, asked in unsupported if asked), None)
        if what is not None:
            raise EngineError(f"{what} is not available on a Genie bundle (engine qairt)")

    # ---- the query thread -----------------------------------------------------

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            if job.cancelled:
                continue
            try:
                self._run(job)
            except Exception as exc:  # one request's failure: the thread goes on
                log.exception("Genie query failed", request_id=job.req.log_id, error=repr(exc))
                message = str(exc) if isinstance(exc, GenieError) else f"the worker failed this request ({type(exc).__name__})"  # fmt: skip
                self._replies.put(Failed(job.req.req_id, ErrorKind.ENGINE, f"Genie failed the query: {message}"))

    def _run(self, job: Job) -> None:
        dialog = self.dialog
        assert dialog is not None
        req = job.req
        if self._dirty:  # a new conversation: the last one's KV cache must not leak into it
            dialog.reset()
            self._dirty = False
        s = req.sampling
        seed = s.seed if s.seed is not None else secrets.randbits(31)
        dialog.set_sampler(sampler_settings(s.temperature, s.top_k, s.top_p, seed, self.n_vocab))
        room = self.n_ctx - job.prompt_tokens
        dialog.set_max_tokens(min(job.max_tokens, room) if job.max_tokens else room)
        self._replies.put(Started(req.req_id, prompt_tokens=job.prompt_tokens))
        with self._lock:
            if job.cancelled:
                return
            self._current = job
        try:
            self._dirty = True
            status = dialog.query(job.prompt, lambda piece, code: self._piece(job, piece, code))
        finally:
            with self._lock:
                self._current = None
        if job.cancelled:
            return  # its Done went out with the Cancel
        rest = job.stream.flush() if job.finish != "stop" else ""  # a held partial stop string is text
        if rest:
            self._delta(job, rest)
        finish = job.finish
        if not finish:
            # `max_tokens` reached, or the context filled (Genie stops there, as told, or says so)
            at_limit = (job.max_tokens and job.n_gen >= job.max_tokens) or job.n_gen >= room
            finish = "length" if at_limit or status == WARNING_CONTEXT_EXCEEDED else "stop"
        self._replies.put(Done(req.req_id, finish, prompt_tokens=job.prompt_tokens, completion_tokens=job.n_gen,
                               stop_sequence=job.stop_sequence))  # fmt: skip

    def _piece(self, job: Job, piece: bytes, code: int) -> None:
        """One piece of Genie's answer (one generated token), on the query thread."""
        if job.cancelled or job.finish:
            if self.dialog is not None:
                self.dialog.abort()  # again: one sent before the query began is lost
            return
        if code == SENTENCE_ABORT or not piece:
            return
        job.n_gen += 1
        text = job.stream.feed(piece)
        if text:
            self._delta(job, text)
        if job.stream.stopped:
            job.finish, job.stop_sequence = "stop", job.stream.matched
        elif job.max_tokens and job.n_gen >= job.max_tokens:
            job.finish = "length"
        if job.finish and self.dialog is not None:
            self.dialog.abort()  # without GenieDialog_signal it runs on, unheard, to its max tokens

    def _delta(self, job: Job, text: str) -> None:
        self._replies.put(Delta(job.req.req_id, text, job.n_gen))


def _text_only(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose content is a list of parts, as one string (chat templates expect text)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            m = {**m, "content": "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))}
        out.append(m)
    return out


def _tokenizer(path: Path) -> Tokenizer | None:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the tokenizers package raises its own exceptions
        log.warning("the bundle's tokenizer cannot be read; token counts are unavailable", path=str(path),
                    error=str(exc)[:300])  # fmt: skip
        return None


def _chat_template(folder: Path) -> tuple[ChatTemplate, bool]:
    """The bundle's chat template (chat_template.jinja, else tokenizer_config.json's), and whether
    the plain role-prefixed one stands in for it (the bundle has none)."""
    config: dict[str, Any] = {}
    try:
        with open(folder / "tokenizer_config.json", "rb") as f:
            loaded = json.loads(f.read(MAX_TEMPLATE_BYTES))
        config = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        pass
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"), None)
    try:
        with open(folder / "chat_template.jinja", encoding="utf-8") as f:
            source = f.read(MAX_TEMPLATE_BYTES)
    except OSError:
        pass
    native = isinstance(source, str) and bool(source.strip())
    template = ChatTemplate(source if native else PLAIN_TEMPLATE, bos_token=_token(config.get("bos_token")),
                            eos_token=_token(config.get("eos_token")))  # fmt: skip
    return template, not native


def _token(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string, or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def load(opts: EngineOptions) -> QairtEngine:
    return QairtEngine(opts)
