"""KV cache types on the real engine (`--cache-type-k`/`-v`): a worker reports the bytes one token's
K and V take in its types, q8_0 about half of f16's; greedy answers in q8_0 and with a q4_0 V cache
(flash attention on for it) begin as f16's do; a type outside the list stops `geniex serve` with one
line, and a model whose head size the type's block does not divide fails its load naming the types."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from protocol.worker_args import WorkerArgs
from tests.conftest import MODEL
from tests.npu_models import TinyGGUF
from tests.server_proc import ServerProcess, serving

# SmolLM2-135M: 30 layers, 3 KV heads of 64 dimensions, so one token's K (or V) is 192 values a layer.
F16_PER_TOKEN = 30 * 3 * 64 * 2 * 2  # (K + V) * 2 bytes = 23,040
Q8_0_PER_TOKEN = 30 * 2 * (192 // 32) * 34  # blocks of 32 values in 34 bytes = 12,240 (0.53 of f16)
V_Q4_0_PER_TOKEN = 30 * (192 * 2 + (192 // 32) * 18)  # K in f16, V in blocks of 32 in 18 bytes = 14,760

QUESTION = [{"role": "user", "content": "Name three primary colors."}]
MAX_TOKENS = 16
# Greedy tokens that must equal f16's. Measured on this build, SmolLM2, 16 tokens each: for this
# question q8_0 and a q4_0 V cache both gave f16's 16; over four questions q8_0 kept 15, 16, 1 and
# 0 of them, a q4_0 V cache 9, 16, 1 and 0. Where q8_0 parts, f16's own top two were within 0.1
# nats and the quantized cache moved log-probabilities by up to 0.17 (llama.cpp's own Llama() gives
# the same numbers: not this server's doing); the 4-bit V cache moves them further. f16's first 5
# tokens here lead their runners-up by 0.89 nats or more (its 6th by 0.07), so those 5 must hold; a
# cache read wrong (a type mixed up, a block misread) would change the answer from its first token.
SAME_PREFIX = 5


def greedy_tokens(client: openai.OpenAI) -> list[str]:
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=MAX_TOKENS, temperature=0,  # type: ignore[arg-type]
                                       logprobs=True)  # fmt: skip
    logprobs = r.choices[0].logprobs
    assert logprobs is not None and logprobs.content
    return [t.token for t in logprobs.content]


def worker_row(srv: ServerProcess) -> dict:
    rows = httpx.get(f"{srv.base_url}/v1/workers", timeout=10).json()["data"]
    return next(w for w in rows if w["model"] == MODEL and w["engine"] == "llama_cpp" and w["state"] != "failed")


def client_for(srv: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def shared_prefix(a: list[str], b: list[str]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.fixture(scope="module")
def q8(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory.mktemp("kv-q8"), "--nctx", "512", "--cache-type-k", "q8_0",
                 "--cache-type-v", "Q8_0") as srv:  # fmt: skip
        yield srv


@pytest.fixture(scope="module")
def v4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory.mktemp("kv-v4"), "--nctx", "512", env={"GENIEX_CACHE_TYPE_V": "q4_0"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def f16_answer(client: openai.OpenAI) -> list[str]:
    """The shared server's (f16, the default) greedy answer."""
    return greedy_tokens(client)


def test_an_f16_worker_reports_its_kv_bytes_per_token(server: ServerProcess, f16_answer: list[str]) -> None:
    row = worker_row(server)
    assert (row["cache_type_k"], row["cache_type_v"], row["kv_bytes_per_token"]) == ("f16", "f16", F16_PER_TOKEN)


def test_q8_0_takes_about_half_and_answers_as_f16_does(q8: ServerProcess, f16_answer: list[str]) -> None:
    answer = greedy_tokens(client_for(q8))
    row = worker_row(q8)
    assert (row["cache_type_k"], row["cache_type_v"]) == ("q8_0", "q8_0")
    assert row["kv_bytes_per_token"] == Q8_0_PER_TOKEN
    assert 0.52 < row["kv_bytes_per_token"] / F16_PER_TOKEN < 0.54
    assert shared_prefix(answer, f16_answer) >= SAME_PREFIX, (answer, f16_answer)


def test_a_q4_0_v_cache_runs_with_flash_attention(v4: ServerProcess, f16_answer: list[str]) -> None:
    """llama.cpp refuses to store V quantized without flash attention ("quantized V cache requires
    flash_attn to be enabled"), so a worker that answers at all has it on; the variable sets the type
    as the flag does."""
    answer = greedy_tokens(client_for(v4))
    row = worker_row(v4)
    assert (row["cache_type_k"], row["cache_type_v"], row["kv_bytes_per_token"]) == ("f16", "q4_0", V_Q4_0_PER_TOKEN)
    assert shared_prefix(answer, f16_answer) >= SAME_PREFIX, (answer, f16_answer)


def serve_and_fail(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1:0", "--data-dir",
                           str(tmp_path), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})  # fmt: skip


def test_a_type_outside_the_list_stops_the_start_with_one_line(tmp_path: Path) -> None:
    done = serve_and_fail(tmp_path, "--cache-type-v", "q4_k")
    assert done.returncode == 2
    assert "argument --cache-type-v: invalid choice: 'q4_k' (choose from 'f32', 'f16', 'bf16', 'q8_0'" in done.stderr
    done = serve_and_fail(tmp_path, env={"GENIEX_CACHE_TYPE_K": "q3"})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "error: GENIEX_CACHE_TYPE_K='q3': choose from f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1"
    )


def head_size_48(path: Path) -> str:
    """A random 1-layer llama of heads of 48 dimensions, which no 32-value block divides."""
    g = TinyGGUF(path, "llama", n_layer=1, n_embd=96, n_ff=128, n_head=2, n_kv=2)
    g.w.add_rope_dimension_count(48)
    g.w.add_layer_norm_rms_eps(1e-5)
    g.tensor("token_embd.weight", 49152, 96)
    g.tensor("output_norm.weight", 96, scale=0.1, base=1.0)
    for name, shape in (("attn_norm", (96,)), ("ffn_norm", (96,)), ("attn_q", (96, 96)), ("attn_k", (96, 96)),
                        ("attn_v", (96, 96)), ("attn_output", (96, 96)), ("ffn_gate", (128, 96)),
                        ("ffn_up", (128, 96)), ("ffn_down", (96, 128))):  # fmt: skip
        g.tensor(f"blk.0.{name}.weight", *shape)
    return g.write()


def test_a_model_the_type_cannot_hold_fails_its_load_naming_the_types(q8: ServerProcess, tmp_path: Path) -> None:
    """llama.cpp stores a K row as whole blocks of its head: the worker it refuses says which types it
    was given and llama.cpp's reason, and the request gets it (a 500), not only "could not create"."""
    from workers.engines import load_engine

    path = head_size_48(tmp_path / "h48.gguf")
    # In f16 it loads (in this process); then the q8_0 server is asked for it.
    load_engine("llama_cpp", WorkerArgs(engine="llama_cpp", model_path=path, nctx=64, parallel=1, threads=1)).close()
    subprocess.run([sys.executable, "-m", "gateway.cli", "pull", "--local", path, "test/h48", "--data-dir",
                    str(q8.data_dir)], check=True, capture_output=True, timeout=60)  # fmt: skip
    r = httpx.post(f"{q8.base_url}/v1/chat/completions", timeout=60,
                   json={"model": "test/h48", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})  # fmt: skip
    assert r.status_code == 500
    assert ("with --cache-type-k q8_0 and --cache-type-v q8_0: K cache type q8_0 with block size 32 does not divide "
            "n_embd_head_k=48") in r.json()["error"]  # fmt: skip
