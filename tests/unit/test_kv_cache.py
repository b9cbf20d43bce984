"""KV cache types (`--cache-type-k`/`-v`): the flags take llama-server's list and refuse anything
else by name, the table the gateway counts with is ggml's own, and a worker's memory estimate and
its default slot count follow the types' sizes."""

from __future__ import annotations

import ctypes
import os

import pytest

from gateway import cli
from gateway.supervisor.memory import WORKER_OVERHEAD, estimate_worker_bytes
from gateway.supervisor.pool import default_parallel
from protocol import kv_cache
from tests.unit.test_memory import smollm2

# SmolLM2-135M: 30 layers, 3 KV heads of 64 dimensions; one token's K (or V) row is 192 values a layer.
F16_PER_TOKEN = 30 * 3 * 64 * 2 * 2  # layers * kv heads * dims * (K + V) * 2 bytes = 23,040
Q8_0_PER_TOKEN = 30 * 2 * (192 // 32 * 34)  # 32 values in 34 bytes: 12,240
Q4_0_PER_TOKEN = 30 * 2 * (192 // 32 * 18)  # 32 values in 18 bytes: 6,480


def test_the_flags_take_llama_servers_types_in_any_case() -> None:
    args = cli.serve_parser().parse_args(["--cache-type-k", "Q8_0", "--cache-type-v", "iq4_NL"])
    settings = cli.settings_from(args)
    assert (settings.cache_type_k, settings.cache_type_v) == ("q8_0", "iq4_nl")
    default = cli.settings_from(cli.serve_parser().parse_args([]))
    assert (default.cache_type_k, default.cache_type_v) == ("f16", "f16")
    assert tuple(kv_cache.KV_TYPES) == ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def test_another_type_is_refused_naming_the_flag_and_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.serve_parser().parse_args(["--cache-type-k", "q3"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "--cache-type-k: invalid choice: 'q3'" in err and "'q8_0'" in err and "'q5_1'" in err


def test_a_variable_of_another_type_stops_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENIEX_CACHE_TYPE_V", "Q4_K")
    with pytest.raises(SystemExit, match="GENIEX_CACHE_TYPE_V='Q4_K': choose from f32, f16, bf16, q8_0, q4_0, q4_1"):
        cli._env_defaults(cli.serve_parser())
    monkeypatch.setenv("GENIEX_CACHE_TYPE_V", "Q4_0")
    p = cli.serve_parser()
    cli._env_defaults(p)
    assert p.parse_args([]).cache_type_v == "q4_0"


def test_the_table_is_ggmls_own() -> None:
    """Each type's id is the one ggml names so, and its row size the one ggml allocates: the gateway
    counts without importing llama.cpp, so a binding whose enum moved must fail here."""
    from llama_cpp._ggml import libggml as g

    g.ggml_type_name.argtypes = [ctypes.c_int]
    g.ggml_type_name.restype = ctypes.c_char_p
    g.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    g.ggml_row_size.restype = ctypes.c_size_t
    g.ggml_is_quantized.argtypes = [ctypes.c_int]
    g.ggml_is_quantized.restype = ctypes.c_bool
    for name, t in kv_cache.KV_TYPES.items():
        assert g.ggml_type_name(t.ggml_type) == name.encode()
        for n in (64, 192, 1024):
            assert g.ggml_row_size(t.ggml_type, n) == kv_cache.row_bytes(name, n), (name, n)
        assert g.ggml_is_quantized(t.ggml_type) == kv_cache.is_quantized(name)


@pytest.mark.parametrize(
    ("type_k", "type_v", "per_token", "ratio"),
    [
        ("f16", "f16", F16_PER_TOKEN, 1.0),
        ("q8_0", "q8_0", Q8_0_PER_TOKEN, 17 / 32),  # 0.53: half, and the blocks' scales
        ("q4_0", "q4_0", Q4_0_PER_TOKEN, 9 / 32),  # 0.28: a quarter, and the scales
        ("q8_0", "f16", (F16_PER_TOKEN + Q8_0_PER_TOKEN) // 2, (1 + 17 / 32) / 2),  # K and V counted apart
        ("f32", "f32", 2 * F16_PER_TOKEN, 2.0),
    ],
)
def test_the_estimate_counts_the_kv_in_its_types(type_k: str, type_v: str, per_token: int, ratio: float) -> None:
    path = smollm2()
    weights = os.path.getsize(path) + WORKER_OVERHEAD
    kv = estimate_worker_bytes(path, 1000, type_k, type_v) - weights
    assert kv == per_token * 1000
    assert kv / (estimate_worker_bytes(path, 1000) - weights) == pytest.approx(ratio)


def test_the_default_slot_count_spends_the_same_memory_in_any_type() -> None:
    """16384 tokens in f16 is the budget: q8_0 holds about twice the tokens in it, f32 half."""
    assert [default_parallel(n) for n in (4096, 8192, 16384, 32768)] == [4, 2, 1, 1]
    assert [default_parallel(n, "q8_0", "q8_0") for n in (4096, 8192, 16384, 32768)] == [4, 3, 1, 1]
    assert [default_parallel(n, "q4_0", "q4_0") for n in (4096, 8192, 16384, 32768)] == [4, 4, 3, 1]
    assert [default_parallel(n, "f32", "f32") for n in (2048, 4096, 8192)] == [4, 2, 1]


@pytest.mark.parametrize(
    ("type_k", "type_v", "flash_attn"),
    [("f16", "f16", "auto"), ("q8_0", "f16", "auto"), ("f16", "q4_0", "on"), ("q8_0", "q8_0", "on")],
)
def test_a_quantized_v_cache_turns_flash_attention_on(
    monkeypatch: pytest.MonkeyPatch, type_k: str, type_v: str, flash_attn: str
) -> None:
    """llama.cpp stores V quantized only with flash attention; `auto` may settle on off for a device
    without it, so the worker asks for it outright, and leaves `auto` (on, for the CPU) otherwise."""
    import llama_cpp as L

    from workers.engines import llama_runtime

    given: list[L.llama_context_params] = []
    monkeypatch.setattr(L, "llama_init_from_model", lambda _model, params: given.append(params) or 1)
    llama_runtime.slot_context(None, nctx=64, parallel=1, n_batch=64, threads=1, type_k=type_k, type_v=type_v)  # type: ignore[arg-type]
    modes = {L.LLAMA_FLASH_ATTN_TYPE_AUTO: "auto", L.LLAMA_FLASH_ATTN_TYPE_ENABLED: "on"}
    assert given[0].type_k == kv_cache.KV_TYPES[type_k].ggml_type
    assert given[0].type_v == kv_cache.KV_TYPES[type_v].ggml_type
    assert modes.get(given[0].flash_attn_type) == flash_attn
