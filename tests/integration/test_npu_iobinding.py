"""The NPU decoder's IO binding (every input and output bound once, the KV arrays shared with
onnxruntime) gives the logits the plain `session.run` path gives, bit for bit: over a chunked
prefill, decode steps, and after `reset(keep)`; in one graph and in chained parts; and falls back to
the plain path, with the same results, when binding fails.

CPU EP only, on the bundled SmolLM2's converted folder (and its conversion in 4 parts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from tests.npu_models import converted, converted_parts
from workers.engines.npu.convert import DecoderConfig
from workers.engines.npu.decoder import Decoder, SessionFactory, cpu_session_factory

N_CTX = 64
CHUNK = 8
PROMPT = [1, 504, 3458, 282, 4649, 314, 7042, 28, 284, 3458, 282, 11906, 314]  # 13 tokens: a full chunk, a padded one


def test_an_ortvalue_over_a_numpy_array_shares_its_memory() -> None:
    """What the binding relies on: the host's writes into its KV arrays are what the next run reads."""
    a = np.zeros((1, 2, 8, 4), np.float32)
    v = ort.OrtValue.ortvalue_from_numpy(a)
    assert v.data_ptr() == a.ctypes.data
    a[0, 1, 3:5] = 7.0
    assert np.array_equal(v.numpy(), a)


def run(dec: Decoder, steps: int = 5) -> list[np.ndarray]:
    """Prefill, greedy decode steps, then reset(keep=6) and another prefill and decodes: every logits."""
    out: list[np.ndarray] = []
    logits = dec.prefill(PROMPT)
    assert logits is not None
    out.append(logits)
    for _ in range(steps):
        out.append(dec.decode(int(np.argmax(out[-1]))))
    dec.reset(keep=6)
    logits = dec.prefill(PROMPT[3:12])  # 9 tokens at position 6: a full chunk and a lone token
    assert logits is not None
    out.append(logits)
    for _ in range(3):
        out.append(dec.decode(int(np.argmax(out[-1]))))
    return out


def same(bound: Decoder, plain: Decoder) -> None:
    a, b = run(bound), run(plain)
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.dtype == y.dtype == np.float32 and x.shape == y.shape
        assert np.array_equal(x, y), (i, float(np.abs(x - y).max()))
    assert bound.n_past == plain.n_past
    for i in range(bound.cfg.n_layer):
        assert np.array_equal(bound.keys[i][:, :, : bound.n_past], plain.keys[i][:, :, : plain.n_past])
        assert np.array_equal(bound.values[i][:, :, : bound.n_past], plain.values[i][:, :, : plain.n_past])


def decoders(folder: Path, factory: SessionFactory | None = None) -> tuple[Decoder, Decoder]:
    cfg = DecoderConfig.load(folder)
    bound = Decoder(folder, cfg, N_CTX, factory or cpu_session_factory(2), chunk=CHUNK)
    plain = Decoder(folder, cfg, N_CTX, cpu_session_factory(2), chunk=CHUNK, io_binding=False)
    return bound, plain


def test_bound_steps_give_the_plain_runs_logits(tmp_path_factory: pytest.TempPathFactory) -> None:
    bound, plain = decoders(converted(tmp_path_factory))
    same(bound, plain)
    assert bound.bound and not plain.bound
    # A returned logits row is the caller's: the next step does not overwrite it.
    first = bound.decode(5)
    kept = first.copy()
    bound.decode(6)
    assert np.array_equal(first, kept)


def test_bound_steps_through_chained_parts(tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = converted_parts(tmp_path_factory)  # the conversion test_npu_parts checks against the plan
    assert len(DecoderConfig.load(folder).graph_parts()) == 4
    bound, plain = decoders(folder)
    same(bound, plain)
    assert bound.bound


class _NoBinding:
    """A session that refuses IO binding (as an EP that cannot take bound buffers would)."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session

    def io_binding(self) -> Any:
        raise RuntimeError("no binding here")

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self.session.run(*args, **kwargs)


class _FailingRun(_NoBinding):
    """Binds, then fails at run time."""

    def io_binding(self) -> Any:
        return self.session.io_binding()

    def run_with_iobinding(self, *_args: Any) -> None:
        raise RuntimeError("bound run failed")


@pytest.mark.parametrize("wrapper", [_NoBinding, _FailingRun])
def test_a_binding_failure_falls_back_to_plain_runs(tmp_path_factory: pytest.TempPathFactory, wrapper: Any) -> None:
    cpu = cpu_session_factory(2)

    def factory(graph: Path, dims: dict[str, int], label: str) -> Any:
        return wrapper(cpu(graph, dims, label))

    bound, plain = decoders(converted(tmp_path_factory), factory)
    same(bound, plain)
    assert not bound.bound
