"""A model served by another OpenAI-compatible server (vLLM, Ray Serve LLM, SGLang, llama-server,
another GenieX): the worker holds a connection pool to it and relays its answers as our own
messages, so the gateway serves it like a local model (one worker per model, its queue, its
accounting and every dialect).

Threads: the worker's loop (workers/server.py) owns the ZeroMQ sockets and calls this engine; an
asyncio loop on a thread of its own runs the HTTP requests (httpx) and the health probe. They
meet through one thread-safe queue of replies, which `step` drains, so no socket is shared
between threads. A Cancel cancels the request's task, which closes its upstream stream: the
upstream sees the disconnect and stops decoding.

The model "file" is a JSON descriptor (protocol/upstream.py). Its credential comes from an
environment variable or a file it names, read once at load; it is sent to the upstream only, and
scrubbed from anything the worker reports.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import msgspec
import structlog

from protocol import upstream as spec_mod
from protocol.upstream import UpstreamSpec, where
from protocol.wire import (
    PROTOCOL_VERSION,
    Done,
    Embed,
    Embeddings,
    ErrorKind,
    Failed,
    FromWorker,
    Generate,
    Ready,
    Rerank,
    Scores,
    Started,
    UpstreamHealth,
)
from workers.engines import TASKS, Emit, EngineError, EngineOptions, Request
from workers.engines.thread_replies import ThreadReplies
from workers.engines.upstream_openai import (
    StreamReader,
    UpstreamFailure,
    embed_request,
    embeddings_of,
    generate_request,
    refusal,
    rerank_request,
    scores_of,
)

log = structlog.get_logger("worker.upstream")

MAX_ERROR_BODY = 64 << 10  # bytes of an upstream's error body read
MAX_ANSWER_BYTES = 256 << 20  # an embeddings or rerank answer, at most
MAX_EVENT_BYTES = 4 << 20  # one line of an upstream's event stream, at most


def read_credential(spec: UpstreamSpec) -> str:
    """The key the descriptor points to ("" for none); EngineError naming where it looked, never what it found."""
    if spec.api_key_env:
        value = os.environ.get(spec.api_key_env, "").strip()
        if not value:
            raise EngineError(f"the upstream credential's environment variable {spec.api_key_env} is not set "
                              "in the server's environment", kind=ErrorKind.ENGINE)  # fmt: skip
        return value
    if spec.api_key_file:
        try:
            with open(spec.api_key_file, encoding="utf-8") as f:
                value = f.read(4096).strip()
        except OSError as exc:
            raise EngineError(f"cannot read the upstream credential file {spec.api_key_file}: {exc.strerror}",
                              kind=ErrorKind.ENGINE) from None  # fmt: skip
        if not value:
            raise EngineError(f"the upstream credential file {spec.api_key_file} is empty", kind=ErrorKind.ENGINE)
        return value
    return ""


class UpstreamEngine:
    name = "upstream"
    # What an upstream can be asked; each model only what its descriptor's capabilities say.
    serves = (Generate, Embed, Rerank)

    def __init__(self, opts: EngineOptions) -> None:
        try:
            with open(opts.model_path, "rb") as f:
                self.spec = spec_mod.decode(f.read(1 << 20))
        except OSError as exc:
            raise EngineError(f"cannot read the upstream descriptor {opts.model_path}: {exc}",
                              kind=ErrorKind.ENGINE) from None  # fmt: skip
        except spec_mod.UpstreamError as exc:
            raise EngineError(str(exc), kind=ErrorKind.ENGINE) from None
        s = self.spec
        self.where = where(s)
        self.nctx = s.context_length or opts.nctx
        caps = set(s.capabilities)
        # What this upstream was registered for (the gateway checks the same before sending).
        self._allowed = {Generate: bool(caps & {"chat", "completion"}), Embed: "embeddings" in caps,
                         Rerank: "rerank" in caps}  # fmt: skip
        self._secret = read_credential(s)
        headers = {"Authorization": f"Bearer {self._secret}"} if self._secret else {}
        self._client = httpx.AsyncClient(
            base_url=s.base_url + "/",
            headers=headers,
            timeout=httpx.Timeout(s.read_timeout, connect=s.connect_timeout),
            limits=httpx.Limits(max_connections=s.max_concurrency + 1, max_keepalive_connections=s.max_concurrency),
            follow_redirects=False,  # a redirect would carry our credential wherever it points
            trust_env=False,  # no proxy or netrc from the environment: the descriptor says where to go
        )
        self._replies: ThreadReplies[None] = ThreadReplies()
        self._tasks: dict[int, asyncio.Task[None]] = {}  # only touched on the loop's thread
        self._loop = asyncio.new_event_loop()
        self._slots: asyncio.Semaphore | None = None
        self._thread = threading.Thread(target=self._run_loop, name="upstream-io", daemon=True)
        self._thread.start()
        self._call(self._setup())

    # ---- the I/O thread -------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _call(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()  # type: ignore[arg-type]

    async def _setup(self) -> None:
        self._slots = asyncio.Semaphore(self.spec.max_concurrency)
        self._probe_task = asyncio.create_task(self._probe_forever())

    def _put(self, msg: FromWorker) -> None:
        self._replies.put(msg)

    def _scrub(self, text: str) -> str:
        return text.replace(self._secret, "[credential]") if self._secret else text

    async def _probe_forever(self) -> None:
        while True:
            self._put(await self.probe())
            await asyncio.sleep(self.spec.probe_interval)

    async def probe(self) -> UpstreamHealth:
        """GET {base}/models: healthy when it answers 200 and lists our model (a server that lists
        nothing, or that has no /models, is taken at its 200)."""
        t0 = time.perf_counter()
        detail = ""
        try:
            r = await self._client.get("models", timeout=min(self.spec.read_timeout, 10.0))
            if r.status_code != 200:
                detail = f"GET /models answered {r.status_code}"
            else:
                try:
                    ids = [m.get("id") for m in r.json().get("data", [])]
                except (ValueError, AttributeError, TypeError):
                    ids = []
                if ids and self.spec.model not in ids:
                    detail = f"the upstream does not list the model {self.spec.model!r}"
        except httpx.TimeoutException:
            detail = "timed out"
        except httpx.HTTPError as exc:
            detail = f"unreachable: {type(exc).__name__}"
        ms = (time.perf_counter() - t0) * 1000
        return UpstreamHealth(self.spec.base_url, not detail, self._scrub(detail), round(ms, 1), time.time())

    def _start(self, req_id: int, work: Callable[[], Awaitable[None]]) -> None:
        async def run() -> None:
            assert self._slots is not None
            try:
                async with self._slots:
                    await work()
            except asyncio.CancelledError:
                pass  # the Cancel's Done was sent by cancel()
            except UpstreamFailure as exc:
                self._put(Failed(req_id, exc.kind, self._scrub(exc.message), exc.code))
            except httpx.ConnectTimeout:
                self._put(Failed(req_id, ErrorKind.UPSTREAM, f"{self.where} is unreachable: connecting timed out "
                                 f"after {self.spec.connect_timeout:g}s"))  # fmt: skip
            except httpx.ConnectError as exc:
                self._put(Failed(req_id, ErrorKind.UPSTREAM, f"{self.where} is unreachable: {self._why(exc)}"))
            except httpx.TimeoutException:
                self._put(Failed(req_id, ErrorKind.UPSTREAM_TIMEOUT, f"{self.where} did not answer within "
                                 f"{self.spec.read_timeout:g}s"))  # fmt: skip
            except httpx.HTTPError as exc:  # the connection broke: mid-answer or before
                self._put(Failed(req_id, ErrorKind.UPSTREAM, f"{self.where} broke off the answer: {self._why(exc)}"))
            except Exception as exc:
                log.exception("upstream request failed", error=repr(exc))
                self._put(Failed(req_id, ErrorKind.ENGINE, f"the worker failed this request ({type(exc).__name__})"))
            finally:
                self._tasks.pop(req_id, None)

        self._tasks[req_id] = asyncio.create_task(run())

    def _why(self, exc: Exception) -> str:
        cause: BaseException = exc
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__  # type: ignore[assignment]
        text = str(cause) or str(exc) or type(exc).__name__
        return self._scrub(text)[:300]

    async def _generate(self, g: Generate) -> None:
        path, body = generate_request(g, self.spec.model)
        reader = StreamReader(g.req_id, self.where)
        async with self._client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                raise refusal(r.status_code, await _read_some(r, MAX_ERROR_BODY, cut=True), self.where)
            self._put(Started(g.req_id, prompt_tokens=0))
            async for line in _lines(r, MAX_EVENT_BYTES, self.where):
                if line.startswith(b"data:"):
                    for msg in reader.feed(line[5:]):
                        self._put(msg)
                    if reader.ended:
                        break
        if not reader.complete():
            raise UpstreamFailure(ErrorKind.UPSTREAM, f"{self.where} broke off the answer before it was complete")
        for msg in reader.close():
            self._put(msg)

    async def _post_json(self, path: str, body: dict[str, Any]) -> Any:
        async with self._client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                raise refusal(r.status_code, await _read_some(r, MAX_ERROR_BODY, cut=True), self.where)
            raw = await _read_some(r, MAX_ANSWER_BYTES)
        try:
            return msgspec.json.decode(raw)
        except msgspec.DecodeError:
            raise UpstreamFailure(ErrorKind.UPSTREAM, f"{self.where} answered something other than JSON") from None

    async def _embed(self, e: Embed) -> None:
        n = len(e.texts if e.texts is not None else e.token_ids or [])
        dim, data, tokens = embeddings_of(await self._post_json("embeddings", embed_request(e, self.spec.model)),
                                          n, self.where)  # fmt: skip
        self._put(Embeddings(e.req_id, n, dim, data, tokens))

    async def _rerank(self, r: Rerank) -> None:
        body = await self._post_json(self.spec.rerank_path, rerank_request(r, self.spec.model))
        scores, tokens = scores_of(body, len(r.documents), self.where)
        self._put(Scores(r.req_id, scores, tokens, "upstream"))

    # ---- the Engine interface (the worker's thread) ---------------------------

    def ready(self) -> Ready:
        return Ready(protocol_version=PROTOCOL_VERSION, pid=os.getpid(), engine=self.name, compute="remote",
                     n_ctx=self.nctx, parallel=self.spec.max_concurrency, chat_template=True,
                     description=f"{self.spec.model} at {self.spec.base_url}", provider=self.spec.base_url,
                     tool_format="hermes")  # fmt: skip

    def submit(self, req: Request) -> None:
        if not self._allowed.get(type(req), False):
            raise EngineError(f"this upstream model is not registered for {TASKS[type(req)]} "
                              "(`geniex pull --upstream-capabilities`)", kind=ErrorKind.UNSUPPORTED)  # fmt: skip
        if isinstance(req, Generate):
            work: Callable[[], Awaitable[None]] = lambda: self._generate(req)  # noqa: E731
        elif isinstance(req, Embed):
            work = lambda: self._embed(req)  # noqa: E731
        elif isinstance(req, Rerank):
            work = lambda: self._rerank(req)  # noqa: E731
        else:  # the worker checks `serves` first
            raise EngineError("not served by an upstream model", kind=ErrorKind.UNSUPPORTED)
        self._replies.active[req.req_id] = None
        self._loop.call_soon_threadsafe(self._start, req.req_id, work)

    def cancel(self, req_id: int, emit: Emit) -> None:
        if req_id not in self._replies.active:
            return
        del self._replies.active[req_id]

        def stop() -> None:
            task = self._tasks.pop(req_id, None)
            if task is not None:
                task.cancel()  # leaves the `async with` of its stream: the connection closes

        self._loop.call_soon_threadsafe(stop)
        emit(Done(req_id, "cancelled"))

    def has_work(self) -> bool:
        return self._replies.pending()

    def step(self, emit: Emit) -> None:
        self._replies.drain(emit, wait=bool(self._replies.active))

    def set_threads(self, n: int) -> None:
        pass

    def idle(self) -> None:
        pass

    def close(self) -> None:
        async def shut() -> None:
            for task in [*self._tasks.values(), self._probe_task]:
                task.cancel()
            await self._client.aclose()

        try:
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(timeout=5)
        except Exception:  # noqa: BLE001, S110 - closing anyway
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


async def _lines(r: httpx.Response, limit: int, where: str = "the upstream") -> AsyncIterator[bytes]:
    """The body's lines, each at most `limit` bytes: an upstream that never ends a line would
    otherwise grow the worker's memory without bound."""
    buf = b""
    async for part in r.aiter_bytes():
        buf += part
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            yield buf[start:end].rstrip(b"\r")
            start = end + 1
        buf = buf[start:]
        if len(buf) > limit:
            raise UpstreamFailure(ErrorKind.UPSTREAM, f"{where} sent an event longer than {limit >> 20} MiB")
    if buf:
        yield buf


async def _read_some(r: httpx.Response, limit: int, *, cut: bool = False) -> bytes:
    """At most `limit` bytes of the body: cut there (`cut`, for an error's message) or refused."""
    out = bytearray()
    async for part in r.aiter_bytes():
        out += part
        if len(out) > limit:
            if cut:
                return bytes(out[:limit])
            raise UpstreamFailure(ErrorKind.UPSTREAM, f"the upstream's answer is larger than {limit >> 20} MiB")
    return bytes(out)


def load(opts: EngineOptions) -> UpstreamEngine:
    return UpstreamEngine(opts)
