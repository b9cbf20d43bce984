"""The qairt engine's request handling (workers/engines/qairt.py) with a FAKE Genie dialog in place of
libGenie's: a real dialog needs a Snapdragon NPU and a bundle compiled for it, neither of which this
machine has. The fake answers each query with scripted pieces through the same callback Genie uses,
honours abort and max tokens as Genie does, and records what it was asked. What these tests prove is
the engine's own mechanics, independent of Genie and of the gateway: streaming, stop strings,
max_tokens, cancellation, one query at a time in order, a reset between conversations, the prompt
rendered with the bundle's chat template, and what it refuses. The binding to the real library is
tests/unit/test_genie_api.py's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from protocol import engines, qnn
from protocol.wire import (
    Constraint,
    CountTokens,
    Delta,
    Done,
    ErrorKind,
    Failed,
    FromWorker,
    Generate,
    Sampling,
    Started,
    TokenCount,
)
from protocol.worker_args import WorkerArgs
from tests.genie_bundles import CHATML, write_bundle
from workers.engines import EngineError
from workers.engines.genie_api import (
    SENTENCE_BEGIN,
    SENTENCE_CONTINUE,
    SENTENCE_END,
    SUCCESS,
    WARNING_ABORTED,
    GenieError,
)
from workers.engines.qairt import QairtEngine


class FakeDialog:
    """A stand-in for genie_api.GenieDialog: answers every query with `script` (or the next of
    `scripts`), one piece per generated token, stopping at an abort or at its max tokens."""

    def __init__(self, scripts: list[list[str]], *, gate: threading.Event | None = None) -> None:
        self.scripts = scripts
        self.gate = gate  # set: each piece after the first waits for it (a slow NPU)
        self.can_abort = True
        self.can_sample = True
        self.calls: list[tuple[str, Any]] = []
        self.aborts = 0
        self.delivered = 0  # pieces handed to the callback
        self.running = 0
        self.most_running = 0
        self._abort = threading.Event()
        self._max = 0
        self.fail_next = False

    def query(self, prompt: str, on_piece: Callable[[bytes, int], None]) -> int:
        self.calls.append(("query", prompt))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        self._abort.clear()
        try:
            if self.fail_next:
                self.fail_next = False
                raise GenieError("GenieDialog_query", -6)
            pieces = self.scripts.pop(0) if len(self.scripts) > 1 else self.scripts[0]
            for i, piece in enumerate(pieces[: self._max or None]):
                if i and self.gate is not None:
                    self.gate.wait(5)
                if self._abort.is_set():
                    on_piece(b"", 4)  # SENTENCE_ABORT, as Genie ends an aborted answer
                    return WARNING_ABORTED
                self.delivered += 1
                on_piece(piece.encode(), SENTENCE_BEGIN if i == 0 else SENTENCE_CONTINUE)
            on_piece(b"", SENTENCE_END)
            return WARNING_ABORTED if self._abort.is_set() else SUCCESS
        finally:
            self.running -= 1

    def abort(self) -> None:
        self.aborts += 1
        self._abort.set()

    def reset(self) -> None:
        self.calls.append(("reset", None))

    def set_max_tokens(self, n: int) -> None:
        self._max = n
        self.calls.append(("max_tokens", n))

    def set_sampler(self, sampler: dict[str, Any]) -> None:
        self.calls.append(("sampler", sampler))

    def close(self) -> None:
        self.calls.append(("close", None))

    def queries(self) -> list[str]:
        return [c[1] for c in self.calls if c[0] == "query"]


@pytest.fixture(autouse=True)
def an_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(qnn, "unavailable_reason", lambda: None)  # as on a Snapdragon


def engine_with(tmp_path: Path, dialog: FakeDialog, *, chat_template: str | None = CHATML) -> QairtEngine:
    folder = write_bundle(tmp_path / "bundle", chat_template=chat_template)
    return QairtEngine(WorkerArgs(engine="qairt", model_path=str(folder)), open_dialog=lambda _config: dialog)


def gen(req_id: int, text: str = "hi", **kw: Any) -> Generate:
    return Generate(req_id, f"req-{req_id}", messages=[{"role": "user", "content": text}], **kw)


def run(engine: QairtEngine, *ids: int, timeout: float = 5.0) -> list[FromWorker]:
    """Step the engine until each of `ids` has its last reply; every reply, in order."""
    out: list[FromWorker] = []
    deadline = time.monotonic() + timeout
    while not all(any(isinstance(m, Done | Failed | TokenCount) and m.req_id == i for m in out) for i in ids):
        assert time.monotonic() < deadline, out
        engine.step(out.append)
    return out


def text_of(msgs: list[FromWorker], req_id: int) -> str:
    return "".join(m.text for m in msgs if isinstance(m, Delta) and m.req_id == req_id)


def done_of(msgs: list[FromWorker], req_id: int) -> Done:
    return next(m for m in msgs if isinstance(m, Done) and m.req_id == req_id)


def test_an_answer_streams_as_deltas_then_done(tmp_path: Path) -> None:
    dialog = FakeDialog([["Hello", " wor", "ld", "!"]])
    engine = engine_with(tmp_path, dialog)
    engine.submit(gen(1, "hello world", sampling=Sampling(temperature=0.3, top_k=20, top_p=0.9, seed=11)))
    msgs = run(engine, 1)
    # The ChatML prompt: its 3 special tokens and 4 words.
    assert isinstance(msgs[0], Started) and msgs[0].prompt_tokens == 7
    assert text_of(msgs, 1) == "Hello world!"
    assert done_of(msgs, 1) == Done(1, "stop", prompt_tokens=7, completion_tokens=4)
    assert dialog.queries() == ["<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"]
    sampler = next(c[1] for c in dialog.calls if c[0] == "sampler")
    assert sampler == {"seed": 11, "top-p": 0.9, "greedy": False, "temp": 0.3, "top-k": 20}
    assert ("max_tokens", 512 - 7) in dialog.calls  # the bundle's context, less the prompt
    ready = engine.ready()
    assert (ready.engine, ready.compute, ready.n_ctx, ready.fallback, ready.chat_template) == ("qairt", "npu", 512, "",
                                                                                               True)  # fmt: skip
    engine.close()


def test_a_bundle_without_a_chat_template_gets_role_prefixed_turns(tmp_path: Path) -> None:
    dialog = FakeDialog([["Hi", " there", "\nUser:", " more"]])
    engine = engine_with(tmp_path, dialog, chat_template=None)
    engine.submit(Generate(1, "r", messages=[{"role": "system", "content": "be brief"},
                                            {"role": "user", "content": [{"type": "text", "text": "hi"}]}]))  # fmt: skip
    msgs = run(engine, 1)
    assert dialog.queries() == ["System: be brief\n\nUser: hi\n\nAssistant:"]
    assert text_of(msgs, 1) == "Hi there"  # the model's next "User:" turn ends its answer
    assert not engine.ready().chat_template
    engine.close()


def test_a_stop_string_split_over_pieces_ends_the_answer_before_it(tmp_path: Path) -> None:
    dialog = FakeDialog([["Hel", "lo ", "ST", "OP", " never", " sent"]])
    engine = engine_with(tmp_path, dialog)
    engine.submit(gen(1, stop=["STOP"]))
    msgs = run(engine, 1)
    assert text_of(msgs, 1) == "Hello "
    assert done_of(msgs, 1) == Done(1, "stop", prompt_tokens=6, completion_tokens=4, stop_sequence="STOP")
    assert dialog.aborts >= 1 and dialog.delivered == 4  # Genie was told to stop at once
    engine.close()


def test_max_tokens_ends_the_answer_with_length(tmp_path: Path) -> None:
    dialog = FakeDialog([["a", "b", "c", "d", "e"]])
    dialog_no_limit = FakeDialog([["a", "b", "c", "d", "e"]])
    engine = engine_with(tmp_path / "1", dialog)
    engine.submit(gen(1, max_tokens=2))
    msgs = run(engine, 1)
    assert text_of(msgs, 1) == "ab" and done_of(msgs, 1).finish_reason == "length"
    assert done_of(msgs, 1).completion_tokens == 2 and ("max_tokens", 2) in dialog.calls
    engine.close()
    # Where Genie does not honour the limit itself, the engine still cuts the answer there.
    dialog_no_limit.set_max_tokens = lambda n: None  # type: ignore[method-assign]
    engine = engine_with(tmp_path / "2", dialog_no_limit)
    engine.submit(gen(1, max_tokens=3))
    msgs = run(engine, 1)
    assert text_of(msgs, 1) == "abc" and done_of(msgs, 1).finish_reason == "length"
    assert dialog_no_limit.aborts >= 1 and dialog_no_limit.delivered == 3
    engine.close()


def test_an_answer_that_fills_the_context_ends_with_length(tmp_path: Path) -> None:
    dialog = FakeDialog([["w"] * 600])  # more than the bundle's 512-token context holds
    engine = engine_with(tmp_path, dialog)
    engine.submit(gen(1))
    msgs = run(engine, 1)
    assert ("max_tokens", 512 - 6) in dialog.calls and dialog.delivered == 512 - 6
    assert done_of(msgs, 1).finish_reason == "length" and done_of(msgs, 1).completion_tokens == 512 - 6
    engine.close()


def test_a_cancel_mid_answer_aborts_the_query_and_the_next_request_starts_afresh(tmp_path: Path) -> None:
    gate = threading.Event()
    dialog = FakeDialog([["one", " two", " three"], ["next"]], gate=gate)
    engine = engine_with(tmp_path, dialog)
    engine.submit(gen(1))
    out: list[FromWorker] = []
    deadline = time.monotonic() + 5
    while not any(isinstance(m, Delta) for m in out):
        assert time.monotonic() < deadline
        engine.step(out.append)
    engine.cancel(1, out.append)
    assert out[-1] == Done(1, "cancelled", prompt_tokens=6, completion_tokens=1)
    assert dialog.aborts == 1  # at once, while the query waits for its next token
    gate.set()
    engine.submit(gen(2, "hello"))
    msgs = run(engine, 2)
    assert not [m for m in msgs if getattr(m, "req_id", None) == 1]  # nothing more of the cancelled one
    assert text_of(msgs, 2) == "next" and dialog.aborts >= 1
    kinds = [c[0] for c in dialog.calls]
    assert kinds.index("reset") > kinds.index("query")  # reset between the two conversations, once
    assert kinds.count("reset") == 1 and kinds[-1] == "query"
    engine.close()


def test_requests_run_one_at_a_time_in_order(tmp_path: Path) -> None:
    gate = threading.Event()
    dialog = FakeDialog([["first", " answer"], ["second"], ["third"]], gate=gate)
    engine = engine_with(tmp_path, dialog)
    for i in (1, 2, 3):
        engine.submit(gen(i, ["hi", "hello", "world"][i - 1]))
    engine.cancel(3, lambda _m: None)  # still queued: it never reaches Genie
    threading.Timer(0.2, gate.set).start()
    msgs = run(engine, 1, 2)
    assert dialog.most_running == 1
    assert [m.req_id for m in msgs if isinstance(m, Started)] == [1, 2]
    started_2 = next(i for i, m in enumerate(msgs) if isinstance(m, Started) and m.req_id == 2)
    assert msgs.index(done_of(msgs, 1)) < started_2  # the second waited for the first to end
    assert [p.split("\n")[1].removesuffix("<|im_end|>") for p in dialog.queries()] == ["hi", "hello"]
    assert [c[0] for c in dialog.calls].count("reset") == 1  # before the second, not before the first
    engine.close()


def test_a_genie_failure_fails_that_request_and_the_next_one_runs(tmp_path: Path) -> None:
    dialog = FakeDialog([["fine"]])
    dialog.fail_next = True
    engine = engine_with(tmp_path, dialog)
    engine.submit(gen(1))
    engine.submit(gen(2))
    msgs = run(engine, 1, 2)
    failed = next(m for m in msgs if isinstance(m, Failed))
    assert (failed.req_id, failed.kind) == (1, ErrorKind.ENGINE)
    assert failed.message == "Genie failed the query: GenieDialog_query failed: GENIE_STATUS_ERROR_QUERY_FAILED (-6)"
    assert text_of(msgs, 2) == "fine" and done_of(msgs, 2).finish_reason == "stop"
    engine.close()


@pytest.mark.parametrize(
    ("kw", "why"),
    [({"logprobs": 2}, "`logprobs` is not available on a Genie bundle"),
     ({"constraint": Constraint("json_schema", "{}", "response_format")}, "`response_format` (constrained output)"),
     ({"suffix": "x", "messages": None, "prompt": "a"}, "`suffix` (fill in the middle)"),
     ({"logit_bias": [(1, 2.0)]}, "`logit_bias`")],
)  # fmt: skip
def test_what_genie_cannot_do_is_refused_naming_it(tmp_path: Path, kw: dict[str, Any], why: str) -> None:
    engine = engine_with(tmp_path, FakeDialog([["x"]]))
    with pytest.raises(EngineError) as exc:
        engine.submit(Generate(1, "r", **{"messages": [{"role": "user", "content": "hi"}], **kw}))
    assert why in exc.value.message and exc.value.kind == ErrorKind.BAD_REQUEST
    engine.close()


def test_a_prompt_longer_than_the_bundles_context_is_refused(tmp_path: Path) -> None:
    engine = engine_with(tmp_path, FakeDialog([["x"]]))
    with pytest.raises(EngineError) as exc:
        engine.submit(gen(1, "hello " * 600))
    assert exc.value.code == "context_length_exceeded" and "context is 512" in exc.value.message
    engine.close()


def test_without_a_dialog_generation_is_a_503_naming_why_and_counts_still_answer(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(qnn, "unavailable_reason", lambda: "this x86_64 host has no NPU")
    opened: list[bytes] = []

    def never(config: bytes) -> FakeDialog:
        opened.append(config)
        raise AssertionError("Genie was asked for a dialog")

    folder = write_bundle(tmp_path / "bundle", chat_template=CHATML)
    engine = QairtEngine(WorkerArgs(engine="qairt", model_path=str(folder)), open_dialog=never)
    assert opened == []  # Genie is not even asked where the host rule says no NPU
    assert engine.ready().fallback == "Genie bundles run only on a Snapdragon NPU, and this x86_64 host has no NPU"
    with pytest.raises(EngineError) as exc:
        engine.submit(gen(1))
    assert exc.value.kind == ErrorKind.OVERLOADED and "this x86_64 host has no NPU" in exc.value.message
    engine.submit(CountTokens(2, "c", messages=[{"role": "user", "content": "hello world"}]))
    assert run(engine, 2) == [TokenCount(2, 7)]
    assert engine.tokenize("hello world", add_special=False, parse_special=True) == [2, 3]
    assert engine.detokenize([2, 3]) == b"hello world"
    engine.close()


def test_the_engines_row_is_npu_only_chat() -> None:
    row = engines.info("qairt")
    assert (row.capabilities, row.units, row.memory, row.tokenizer) == (("chat", "completion", "tools"), ("npu",),
                                                                        "files", True)  # fmt: skip
    assert row.npu == "qairt" and not row.gpu and not row.hybrid and row.working_bytes > 0


def test_close_frees_the_dialog(tmp_path: Path) -> None:
    dialog = FakeDialog([["x"]])
    engine = engine_with(tmp_path, dialog)
    engine.close()
    assert dialog.calls[-1] == ("close", None) and engine.dialog is None
