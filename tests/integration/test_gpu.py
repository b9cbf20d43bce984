"""`compute: gpu` on a real Vulkan device: llama.cpp's Vulkan build (`make llama-vulkan`, a venv of
its own beside the suite's) on Mesa's lavapipe, a Vulkan driver that runs on the CPU, so the GPU
path is proven on any Linux box (lavapipe proves the path, not a GPU's speed). llama.cpp skips
CPU-type Vulkan devices unless GGML_VK_VISIBLE_DEVICES names them; VK_ICD_FILENAMES keeps the
loader to lavapipe even where a real GPU is present.

Without that build the module is skipped, saying how to get it; `.ci/run` builds it (once per
machine), so CI always runs it. Without any GPU build, `compute: gpu` falls back to the CPU with a
warning: tests/integration/test_compute_fallback.py and tests/unit/test_compute.py."""

from __future__ import annotations

import glob
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import MODEL
from tests.server_proc import ServerProcess, serving

VULKAN_PYTHON = Path(__file__).resolve().parents[2] / ".venv" / "vulkan" / "bin" / "python"
LAVAPIPE = sorted(glob.glob("/usr/share/vulkan/icd.d/lvp_icd.*.json"))

pytestmark = [
    pytest.mark.skipif(not VULKAN_PYTHON.exists(), reason="no Vulkan build of llama.cpp: `make llama-vulkan`"),
    pytest.mark.skipif(not LAVAPIPE, reason="no lavapipe (Debian: mesa-vulkan-drivers)"),
    pytest.mark.slow,
    # lavapipe runs a decode step in about half a second on an idle 2-core box, far longer beside other work.
    pytest.mark.timeout(600),
]

# Wide margins between the greedy token and the next (see docs/accelerators.md): fp16 on the GPU
# and fp32 on the CPU round differently, and a near-tie may flip.
ASK = [{"role": "user", "content": "Continue the sequence: 1, 2, 3, 4,"}]
# The CPU and the GPU must agree on the first AGREE greedy tokens. TOKENS was 8, but only the first
# AGREE were ever asserted on; each further token is a forward pass of about a second on lavapipe
# (with the 31 layers offloaded), so generating exactly AGREE asserts the same in half the passes.
AGREE = 4
TOKENS = AGREE
# For the ngl placement test, a prompt of about 20 tokens (ASK, with SmolLM2's default system prompt,
# is 46). llama.cpp hands a batch of 32 tokens or more to the Vulkan device op by op even for the
# layers left on the CPU (ggml's op offload), so with ngl 10 ASK's prefill took 13 s on lavapipe and
# with ngl 0 3 s. The layer counts asserted come from the load, not from the prompt.
SHORT = [{"role": "system", "content": "Count."}, {"role": "user", "content": "1, 2, 3,"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    env = {"GGML_VK_VISIBLE_DEVICES": "0", "VK_ICD_FILENAMES": LAVAPIPE[0]}
    # --ngl 999: the spec's "every layer", the default of requests that do not say
    with serving(tmp_path_factory.mktemp("gpu"), "--nctx", "512", "--ngl", "999", "--load-timeout-s", "300", env=env,
                 python=str(VULKAN_PYTHON)) as srv:  # fmt: skip
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def _greedy(client: openai.OpenAI, tokens: int = TOKENS, messages: list[dict[str, str]] = ASK,
            **extra: Any) -> list[str]:  # fmt: skip
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=tokens, temperature=0,  # type: ignore[arg-type]
                                       logprobs=True, extra_body=extra)  # fmt: skip
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.content
    return [t.token for t in r.choices[0].logprobs.content]


def _row(server: ServerProcess, compute: str, ngl: int | None = None) -> dict[str, Any]:
    rows = [w for w in httpx.get(f"{server.base_url}/v1/workers").json()["data"] if w["compute"] == compute]
    if ngl is not None:
        rows = [w for w in rows if w["ngl"] == ngl]
    assert len(rows) == 1, rows
    row: dict[str, Any] = rows[0]
    return row


def test_gpu_runs_on_the_vulkan_device_and_agrees_with_the_cpu(client: openai.OpenAI, server: ServerProcess) -> None:
    cpu = _greedy(client, compute="cpu")
    gpu = _greedy(client, compute="gpu")  # ngl: the server's default, 999: every layer
    row = _row(server, "gpu", 999)
    assert (row["runs_on"], row["fallback"]) == ("gpu", None), row
    vulkan = [d for d in row["devices"] if d["kind"] in ("gpu", "igpu")]
    assert vulkan and vulkan[0]["name"].startswith("Vulkan") and "llvmpipe" in vulkan[0]["description"], row
    assert vulkan[0]["memory_total"] > 0
    assert row["n_layers"] == 31 and row["offloaded_layers"] == 31  # SmolLM2: 30 layers and the output
    assert _row(server, "cpu")["offloaded_layers"] == 0
    model = next(m for m in httpx.get(f"{server.base_url}/v1/models").json()["data"] if m["id"].startswith(MODEL))
    on_gpu = [r for r in model["loaded"] if r["compute"] == "gpu" and r["offloaded_layers"] == 31]
    assert on_gpu and on_gpu[0]["devices"] == [vulkan[0]["name"]] and on_gpu[0]["runs_on"] == "gpu", model["loaded"]
    agree = next((i for i, (a, b) in enumerate(zip(cpu, gpu, strict=True)) if a != b), TOKENS)
    print(f"greedy tokens: {agree} of {TOKENS} agree; cpu {cpu!r}, gpu {gpu!r}")
    assert agree >= AGREE, (cpu, gpu)


def test_ngl_0_keeps_every_layer_on_the_cpu_and_a_partial_ngl_splits(
    client: openai.OpenAI, server: ServerProcess
) -> None:
    # One token each, from SHORT: what this test proves is where the layers went (the rows below) and that a
    # worker so split still answers; the output itself is test_gpu_runs_on_the_vulkan_device's.
    none = _greedy(client, 1, SHORT, compute="gpu", ngl=0)
    some = _greedy(client, 1, SHORT, compute="gpu", ngl=10)
    assert none and some
    assert (_row(server, "gpu", 0)["offloaded_layers"], _row(server, "gpu", 0)["n_layers"]) == (0, 31)
    split = _row(server, "gpu", 10)
    assert (split["runs_on"], split["offloaded_layers"], split["n_layers"]) == ("gpu", 10, 31), split


def test_the_vulkan_venv_uses_this_checkout() -> None:
    """The Vulkan venv runs this checkout's code with its own llama_cpp (deploy/llama-vulkan.sh)."""
    import subprocess

    out = subprocess.run([str(VULKAN_PYTHON), "-I", "-c", "import gateway, llama_cpp; print(gateway.__file__); "
                          "print(llama_cpp.__file__)"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "GGML_VK_VISIBLE_DEVICES": "0"})  # fmt: skip
    gateway_file, llama_file = out.stdout.split()
    assert Path(gateway_file).is_relative_to(Path(__file__).resolve().parents[2]), out
    assert "/.venv/vulkan/" in llama_file, out


def test_the_doctor_runs_a_few_tokens_on_the_gpu_and_says_why_lavapipe_is_hidden() -> None:
    """`geniex doctor` with the Vulkan build: lavapipe named by GGML_VK_VISIBLE_DEVICES takes every
    layer; unnamed, llama.cpp skips it, and the report says so (and what to set) instead of "no GPU"."""
    base = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"} | {"VK_ICD_FILENAMES": LAVAPIPE[0]}
    cmd = [str(VULKAN_PYTHON), "-m", "gateway.cli", "doctor", "--json", "--compute", "gpu", "--require", "gpu"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=base | {"GGML_VK_VISIBLE_DEVICES": "0"})
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert done.returncode == 0, done.stdout + done.stderr
    assert checks["gpu.backends"]["status"] == "ok" and "llvmpipe" in checks["gpu.backends"]["detail"], checks
    assert checks["gpu.offload_run"]["status"] == "ok" and "31 of 31 layers" in checks["gpu.offload_run"]["detail"]
    hidden = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=base)
    report = json.loads(hidden.stdout)
    assert hidden.returncode == 1 and report["units"] == [
        {"unit": "gpu", "usable": False, "why": report["units"][0]["why"], "check": "gpu.backends"}
    ], report
    assert "Vulkan backend sees no GPU device" in report["units"][0]["why"]
    assert "GGML_VK_VISIBLE_DEVICES" in report["units"][0]["why"]
