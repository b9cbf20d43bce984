"""The worker's loop: one thread, one engine, two ZeroMQ sockets.

Commands arrive on a PULL socket and replies leave on a PUSH socket, so nothing
ever waits for an acknowledgement per token. Between decode steps the loop
polls for commands without blocking, which is how a Cancel lands within a
token. When idle it blocks on the socket, waking now and then to check that
the gateway is still alive.
"""

from __future__ import annotations

import os
import sys
import time
from typing import cast

import msgspec
import structlog
import zmq

from protocol.wire import (
    PROTOCOL_VERSION,
    Cancel,
    Detokenize,
    Done,
    Dying,
    ErrorKind,
    Failed,
    FromWorker,
    SetThreads,
    Shutdown,
    Text,
    Tokenize,
    TokenList,
    Warmup,
    worker_codec,
)
from workers.engines import TASKS, Engine, EngineError, Request, Tokenizes
from workers.heartbeat import Heartbeat, Progress

log = structlog.get_logger("worker")

IDLE_POLL_MS = 500


class WorkerServer:
    def __init__(self, engine: Engine, ctx: zmq.Context, inbox: str, outbox: str, parent_pid: int) -> None:
        self.engine = engine
        self.codec = worker_codec()
        self.pull = ctx.socket(zmq.PULL)
        self.pull.connect(inbox)
        self.push = ctx.socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 2000)
        self.push.connect(outbox)
        self.parent_pid = parent_pid
        self.running = True
        self.progress = Progress()
        self.heartbeat = Heartbeat(ctx, outbox, self.progress)

    def send(self, msg: FromWorker) -> None:
        self.push.send(self.codec.encode(msg), copy=False)

    def serve(self) -> None:
        self.send(self.engine.ready())
        self.heartbeat.start()
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        while self.running:
            busy = self.engine.has_work()
            if poller.poll(0 if busy else IDLE_POLL_MS):
                self._drain()
            elif not busy:
                if os.getppid() != self.parent_pid:
                    log.warning("gateway is gone; exiting")
                    return
                self.engine.idle()
            if self.running and self.engine.has_work():
                self.progress.begin()
                self.engine.step(self.send)
                self.progress.end()

    def _drain(self) -> None:
        while self.running:
            try:
                raw = self.pull.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                msg = self.codec.decode(raw.buffer)
            except msgspec.DecodeError as exc:  # not fatal: the gateway's next message is fine
                self._unknown(bytes(raw.buffer), str(exc))
                continue
            self.progress.begin()  # a submit tokenizes: a tokenizer that never returns is a stuck step too
            self._handle(msg)
            self.progress.end()

    def _unknown(self, raw: bytes, why: str) -> None:
        """A message this worker cannot read (a gateway of another protocol version, a new type
        without its case): refused by its request id where it has one, so that its request fails
        at once instead of waiting for an answer that never comes."""
        try:
            fields = msgspec.msgpack.decode(raw)
        except msgspec.DecodeError:
            fields = None
        # Requests are array_like and tagged: [tag, req_id, ...].
        if isinstance(fields, list) and len(fields) >= 2 and isinstance(fields[1], int):
            tag = str(fields[0])[:64]
            log.error("unknown message refused", tag=tag, req_id=fields[1], error=why)
            self.send(Failed(fields[1], ErrorKind.UNSUPPORTED,
                             f"this worker (protocol version {PROTOCOL_VERSION}) does not know the message {tag!r}"))  # fmt: skip
        else:
            log.error("undecodable message dropped", error=why, size=len(raw))

    def _handle(self, msg: object) -> None:
        if type(msg) in TASKS:  # work for the engine: Generate, Embed, Transcribe...
            self._submit(cast(Request, msg))
            return
        match msg:
            case Tokenize() | Detokenize():
                self._tokens(msg)
            case Cancel():
                self.engine.cancel(msg.req_id, self.send)
            case Warmup():
                self.send(Done(msg.req_id, "stop"))
            case SetThreads():
                self.engine.set_threads(msg.n)
            case Shutdown():
                self.running = False
            case _:  # a message the wire knows and this loop has no case for
                req_id = getattr(msg, "req_id", None)
                tag = type(msg).__struct_config__.tag if isinstance(msg, msgspec.Struct) else type(msg).__name__
                log.error("unhandled message refused", tag=tag, req_id=req_id)
                if isinstance(req_id, int):
                    self.send(Failed(req_id, ErrorKind.UNSUPPORTED, f"this worker does not handle the message {tag!r}"))

    def _submit(self, msg: Request) -> None:
        if type(msg) not in self.engine.serves:
            self.send(Failed(msg.req_id, ErrorKind.UNSUPPORTED, f"this model does not support {TASKS[type(msg)]}"))
            return
        try:
            self.engine.submit(msg)
        except EngineError as exc:
            self.send(exc.failed(msg.req_id))
        except Exception as exc:
            log.exception("request refused by an error in the worker", error=repr(exc))
            self.send(Failed(msg.req_id, ErrorKind.ENGINE, f"the worker failed this request ({type(exc).__name__})"))

    def _tokens(self, msg: Tokenize | Detokenize) -> None:
        """Answered at once, between decode steps: tokenizing is quick and the gateway bounds the
        text, so nothing is queued behind the running generations."""
        engine = cast("Tokenizes", self.engine)
        if not hasattr(engine, "tokenize"):
            self.send(Failed(msg.req_id, ErrorKind.UNSUPPORTED, "this model has no tokenizer"))
            return
        try:
            if isinstance(msg, Tokenize):
                ids = engine.tokenize(msg.content, add_special=msg.add_special, parse_special=msg.parse_special)
                self.send(TokenList(msg.req_id, ids, engine.pieces(ids) if msg.with_pieces else []))
            else:
                self.send(Text(msg.req_id, engine.detokenize(msg.tokens)))
        except EngineError as exc:
            self.send(exc.failed(msg.req_id))
        except Exception as exc:
            log.exception("request refused by an error in the worker", error=repr(exc))
            self.send(Failed(msg.req_id, ErrorKind.ENGINE, f"the worker failed this request ({type(exc).__name__})"))

    def close(self) -> None:
        self.heartbeat.stop()
        self.pull.close(0)
        self.push.close()


def run(engine_factory, inbox: str, outbox: str, parent_pid: int) -> int:  # type: ignore[no-untyped-def]
    """Load the engine, serve until told to stop; report a fatal error as Dying."""
    ctx = zmq.Context()
    push_for_dying = None
    try:
        t0 = time.perf_counter()
        engine = engine_factory()
        log.info("engine loaded", seconds=round(time.perf_counter() - t0, 3))
        server = WorkerServer(engine, ctx, inbox, outbox, parent_pid)
        push_for_dying = server
        try:
            server.serve()
        finally:
            server.close()
            engine.close()
        return 0
    except BaseException as exc:  # noqa: BLE001 - the last word must reach the gateway
        message = f"{type(exc).__name__}: {exc}"
        log.error("worker failed", error=message)
        try:
            if push_for_dying is not None:
                push_for_dying.send(Dying(message))
            else:
                sock = ctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 2000)
                sock.connect(outbox)
                sock.send(worker_codec().encode(Dying(message)))
                sock.close()
        except Exception:  # noqa: BLE001, S110 - dying anyway; the message still reaches stderr below
            pass
        print(message, file=sys.stderr)
        return 1
    finally:
        ctx.term()
