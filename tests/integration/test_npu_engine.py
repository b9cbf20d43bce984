"""The NPU chat engine's request handling (sampling, grammar, stop strings, cancel, KV reuse), on the
converted graph run by onnxruntime's CPU EP: the same engine code as on QNN, at CPU speed, so it
needs no simulator. Compared with llama.cpp's CPU engine where the two must agree.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from protocol.wire import Constraint, Delta, Done, FromWorker, Generate, Logits, Sampling, Started
from protocol.worker_args import WorkerArgs
from tests.npu_models import bundled_gguf, converted
from workers.engines import EngineError
from workers.engines.npu.engine import NpuChatEngine

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = Sampling(temperature=0.0)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NpuChatEngine]:
    folder = converted(tmp_path_factory)
    opts = WorkerArgs(engine="llama_npu", model_path=bundled_gguf(), compute="npu", nctx=128, ngl=0, parallel=1, threads=2,
                     stream_interval_ms=0, batch_tokens=0, cache_ram_mb=0, cache_dir=str(folder.parent))  # fmt: skip
    eng = NpuChatEngine(opts, cpu_threads=2)
    yield eng
    eng.close()


def run(engine: NpuChatEngine, *reqs: Generate) -> list[FromWorker]:
    out: list[FromWorker] = []
    for req in reqs:
        engine.submit(req)
    while engine.has_work():
        engine.step(out.append)
    return out


def text_of(msgs: list[FromWorker], req_id: int = 1) -> str:
    return "".join(m.text for m in msgs if isinstance(m, Delta) and m.req_id == req_id)


def done_of(msgs: list[FromWorker], req_id: int = 1) -> Done:
    return next(m for m in msgs if isinstance(m, Done) and m.req_id == req_id)


def gen(req_id: int = 1, **kw: object) -> Generate:
    kw.setdefault("messages", QUESTION)
    kw.setdefault("sampling", GREEDY)
    kw.setdefault("max_tokens", 8)
    return Generate(req_id=req_id, log_id=f"t{req_id}", **kw)  # type: ignore[arg-type]


def test_a_stop_string_cuts_the_text_and_a_repeat_reuses_the_kv(engine: NpuChatEngine) -> None:
    first = run(engine, gen())
    full = text_of(first)
    assert len(full.split()) >= 3, full
    stop = " " + full.split()[2]
    again = run(engine, gen(stop=[stop]))
    started = next(m for m in again if isinstance(m, Started))
    assert started.cached_tokens == started.prompt_tokens - 1  # the same conversation: only its last token is fed
    assert text_of(again) == full[: full.index(stop)]
    assert (done_of(again).finish_reason, done_of(again).stop_sequence) == ("stop", stop)


def test_a_grammar_holds_the_output(engine: NpuChatEngine) -> None:
    msgs = run(engine, gen(constraint=Constraint("gbnf", 'root ::= "yes" | "no"\n', "grammar_string"), max_tokens=5,
                           sampling=Sampling(temperature=1.0, seed=3)))  # fmt: skip
    assert text_of(msgs) in ("yes", "no") and done_of(msgs).finish_reason == "stop"


def test_seed_repeats_and_logit_bias_steers(engine: NpuChatEngine) -> None:
    hot = Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42)
    a, b = run(engine, gen(sampling=hot, cache=False)), run(engine, gen(sampling=hot, cache=False))
    assert text_of(a) == text_of(b)
    first = text_of(run(engine, gen(max_tokens=1)))
    banned = engine.tokenize(first, add_special=False, parse_special=False)
    assert len(banned) == 1, banned
    steered = text_of(run(engine, gen(max_tokens=1, logit_bias=[(banned[0], -100.0)])))
    assert steered and steered != first


def test_cancel_mid_prompt_and_queue_in_order(engine: NpuChatEngine) -> None:
    out: list[FromWorker] = []
    engine.submit(gen(1, messages=[{"role": "user", "content": "Tell me a long story about a dragon. " * 3}]))
    engine.submit(gen(2, max_tokens=2))
    engine.step(out.append)  # admits 1 and feeds its first prompt chunk
    engine.cancel(1, out.append)
    while engine.has_work():
        engine.step(out.append)
    assert done_of(out, 1).finish_reason == "cancelled" and text_of(out, 1) == ""
    started2 = next(m for m in out if isinstance(m, Started) and m.req_id == 2)
    assert started2.cached_tokens == 0  # a cancelled request leaves no KV to reuse
    assert done_of(out, 2).completion_tokens == 2


def test_what_the_engine_lacks_is_refused_by_name(engine: NpuChatEngine) -> None:
    with pytest.raises(EngineError, match="NPU engine"):
        engine.submit(gen(logprobs=2))
    with pytest.raises(EngineError, match="NPU engine"):
        engine.submit(gen(messages=None, prompt="def f(", suffix="return 1"))
    with pytest.raises(EngineError, match="NPU engine"):
        engine.submit(Logits(req_id=9, log_id="t9", input_ids=[1, 2, 3]))
    with pytest.raises(EngineError, match="NPU context is 128"):
        engine.submit(gen(messages=[{"role": "user", "content": "word " * 200}]))


def test_ready_says_how_the_weights_reached_the_graph(engine: NpuChatEngine) -> None:
    assert engine.ready().description.endswith("; weights: requantized q4_1→4-bit (210 tensors), q8_0 exact (1)")
