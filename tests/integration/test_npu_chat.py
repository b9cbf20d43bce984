"""`compute: npu` chat through the real server, on QNN's HTP simulator (x86_64), against `compute: cpu`;
the model compiled beforehand by `geniex npu compile --bundle` and imported by `geniex pull --local`,
as a laptop would take a model compiled on another machine.

The model is the bundled SmolLM2 cut to its first 2 of 30 layers (tests/npu_models.truncated_gguf):
its architecture, tokenizer, chat template and Q4_1 weights, so the compile, the bundle and both
engines take the path the whole model does. The simulator models the HTP's arithmetic, not its
speed, and a simulated step's time grows with the layers: with 2 the module takes about a third of
the whole model's time, the rest mostly the tied head (49152 x 576, whatever the depth), which the
32-token prefill runs for every position. Still slow-ish on a busy 2-core box, so the requests are a
few tokens.

A weight-shared bundle (`--shared-weights`) is compiled here too, and checked for what it holds; its
binaries load only on a Snapdragon (the simulator crashes loading a binary whose two graphs share
weights), so the shared load path is run on a binary of one graph, prefill's, which the simulator loads.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from protocol.npu_bundle import BUNDLE_FILE, GRAPHS_DIR, imported_shared
from tests.npu_models import truncated_gguf
from tests.server_proc import ServerProcess, serving

pytestmark = [
    pytest.mark.slow,
    # A liveness bound, not a speed one: a simulated step takes seconds on an idle box and half a
    # minute on a loaded one (CI saw 275 s for this module's first test beside other work).
    pytest.mark.timeout(900),
    pytest.mark.skipif(importlib.util.find_spec("onnxruntime_qnn") is None, reason="needs onnxruntime-qnn"),
]

# The 2-layer model's name in both data dirs: the CPU engine runs that same file, so the two engines'
# greedy tokens are compared on the same weights.
MODEL = "geniex-tests/SmolLM2-135M-Instruct-2-layers:Q4_1"

# A short system turn keeps the prompt within one 32-token prefill chunk.
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]


def _geniex(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True,
                          timeout=900, env=env)  # fmt: skip


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("npu-build")
    gguf = truncated_gguf(build / "smollm2-2-layers.gguf", 2)
    done = _geniex("pull", MODEL, "--local", gguf, "--data-dir", str(build / "data"))
    assert done.returncode == 0, done.stdout + done.stderr
    done = _geniex("npu", "compile", MODEL, "--data-dir", str(build / "data"), "--nctx", "128", "--bundle",
                   str(build / "bundle"), env={**os.environ, "GENIEX_QNN_SIMULATOR": "1"})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bundle" in done.stdout and (build / "bundle" / BUNDLE_FILE).is_file()
    return build / "bundle"


@pytest.fixture(scope="module")
def server(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("npu-data")
    done = _geniex("pull", MODEL, "--local", str(bundle), "--data-dir", str(data))
    assert done.returncode == 0 and done.stdout.strip() == MODEL, done.stdout + done.stderr
    with serving(data, "--qnn-simulator", "--nctx", "128", "--load-timeout-s", "600", "--keep-alive-s", "600") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=600)


def test_npu_chat_gives_the_cpu_engines_greedy_tokens(client: openai.OpenAI, server: ServerProcess) -> None:
    kw = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "temperature": 0}
    cpu = client.chat.completions.create(**kw, extra_body={"compute": "cpu"})  # type: ignore[call-overload]
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"compute": "npu"}))  # type: ignore[call-overload]  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert cpu.choices[0].message.content and text == cpu.choices[0].message.content
    usage = chunks[-1].usage
    assert usage is not None and cpu.usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (cpu.usage.prompt_tokens, 4)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]

    rows = {w["compute"]: w for w in httpx.get(f"{server.base_url}/v1/workers").json()["data"]}
    npu = rows["npu"]
    assert npu["engine"] == "llama_npu" and npu["provider"] == "QNNExecutionProvider"
    assert npu["runs_on"] == "npu" and npu["fallback"] is None
    events = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    loaded = [e for e in events if e.get("event") == "npu chat model loaded"]
    assert len(loaded) == 1 and list(loaded[0]["nodes"]) == ["QNNExecutionProvider"], loaded  # no CPU node
    # The bundle's context binaries were found: nothing was compiled on this "laptop".
    built = [e for e in events if e.get("event") == "npu session ready"]
    assert len(built) == 2 and {e["context_cache"] for e in built} == {"warm"}, built


def test_what_the_npu_engine_lacks_is_a_400_naming_it(server: ServerProcess) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1, "compute": "npu", "logprobs": True}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=600)
    assert r.status_code == 400 and "NPU engine" in r.json()["error"], r.text


def _copy(bundle: Path, to: Path) -> Path:
    """The bundle's files hard-linked into a new folder (its manifest copied, to be edited)."""
    for f in bundle.rglob("*"):
        if f.is_file():
            (to / f.relative_to(bundle)).parent.mkdir(parents=True, exist_ok=True)
            if f.name == BUNDLE_FILE:
                (to / f.relative_to(bundle)).write_bytes(f.read_bytes())
            else:
                os.link(f, to / f.relative_to(bundle))
    return to


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ({"soc": "8-elite"}, "compiled for the 8-elite and this machine is a x-elite"),
        ({"qnn_version": "0.1"}, "compiled with onnxruntime-qnn 0.1"),
        ({"converter_version": 1}, "converter's version 1"),
        ({"files": ["../../../../etc/passwd"]}, "is not a plain path inside the bundle"),
        ({"gguf": "/srv/models/m.gguf"}, "is not a plain path inside the bundle"),
    ],
)
def test_a_bundle_for_another_machine_or_reaching_outside_is_refused(
    bundle: Path, tmp_path: Path, edit: dict[str, object], reason: str
) -> None:
    copy = _copy(bundle, tmp_path / "bundle")
    manifest = json.loads((copy / BUNDLE_FILE).read_text())
    (copy / BUNDLE_FILE).write_text(json.dumps({**manifest, **edit}))
    data = tmp_path / "data"
    done = _geniex("pull", MODEL, "--local", str(copy), "--data-dir", str(data))
    assert done.returncode == 1 and reason in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (data / "models").exists() and not (data / "npu").exists(), "nothing was imported"


def _compile_shared(bundle: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """--shared-weights over the `bundle` fixture's data dir: its model pulled and converted already."""
    return _geniex("npu", "compile", MODEL, "--data-dir", str(bundle.parent / "data"), "--nctx", "128", "--bundle",
                   str(out), "--shared-weights", env={**os.environ, "GENIEX_QNN_SIMULATOR": "1"})  # fmt: skip


def test_a_shared_bundle_holds_one_binary_per_part_with_the_weights_once(bundle: Path, tmp_path: Path) -> None:
    import onnx

    done = _compile_shared(bundle, tmp_path / "shared")
    assert done.returncode == 0 and "weight-shared" in done.stdout, done.stdout + done.stderr
    shared = tmp_path / "shared"
    manifest = json.loads((shared / BUNDLE_FILE).read_text())
    assert manifest["shared_weights"] is True
    files = [shared / GRAPHS_DIR / f for f in manifest["files"]]
    binaries = [f for f in files if f.name.endswith("_qnn.bin")]
    assert len(binaries) == 1 and binaries[0].name.startswith("qnn-shared-"), manifest["files"]  # one part: one
    assert not [f for f in files if f.name.startswith("qnn-ctx-")], "no unshared binary rides along"
    contexts = [onnx.load(str(f)) for f in files if f.name.startswith("qnn-shared-") and f.suffix == ".onnx"]
    assert len(contexts) == 2  # prefill's and decode's, with the graph's own input names, both naming the binary
    for ctx in contexts:
        (node,) = ctx.graph.node
        attrs = {a.name: a for a in node.attribute}
        assert attrs["ep_cache_context"].s.decode() == binaries[0].name
        assert "inputs_embeds" in [i.name for i in ctx.graph.input] and attrs["io_name_overrides"].s
    # The weights once: against the two unshared binaries of the same model (each with its own copy).
    unshared = sum(f.stat().st_size for f in (bundle / GRAPHS_DIR).glob("qnn-ctx-*_qnn.bin"))
    assert binaries[0].stat().st_size < 0.6 * unshared, (binaries[0].stat().st_size, unshared)

    data = tmp_path / "data"
    done = _geniex("pull", MODEL, "--local", str(shared), "--data-dir", str(data))
    assert done.returncode == 0, done.stdout + done.stderr
    (converted,) = (data / "npu").iterdir()
    assert imported_shared(converted) and not imported_shared(next((bundle.parent / "data" / "npu").iterdir()))


def test_the_shared_load_path_gives_the_unshared_prefill_logits(bundle: Path, tmp_path: Path) -> None:
    """Prefill's context weight-shared (a binary of one graph: the simulator loads it), decode's the
    bundle's unshared one: the decoder loads the first through the shared path (its graph's names
    restored, `ep.share_ep_contexts`), and its prefill's logits are the unshared decoder's. (Decode
    steps would run the same unshared context in both, so none is run: each costs seconds here.)"""
    import numpy as np

    from workers.engines.npu.convert import DecoderConfig
    from workers.engines.npu.decoder import Decoder, qnn_session_factory
    from workers.engines.npu.shared import compile_shared
    from workers.engines.onnx import qnn_options, register_qnn

    folder = _copy(bundle / GRAPHS_DIR, tmp_path / "npu")
    for prefill in folder.glob("qnn-ctx-model-s32-*"):
        prefill.unlink()  # were the shared one not taken, prefill would compile, not load ("cold")
    cfg, devices, options = DecoderConfig.load(folder), register_qnn(), qnn_options()
    (part,) = compile_shared(folder, cfg, 128, devices, options, folder, seqs=(32,))
    assert part.contexts[0].startswith("qnn-shared-model-s32-")

    def prefill(folder: Path, shared: bool) -> np.ndarray:
        builds: list[bool] = []
        make = qnn_session_factory(devices, options, 2, cpu_fallback=False, shared=shared,
                                   on_build=lambda _label, _secs, warm: builds.append(warm))  # fmt: skip
        dec = Decoder(folder, cfg, 128, make)
        assert builds == [True, True], "both shapes loaded, none compiled"
        logits = dec.prefill(list(range(100, 120)))
        assert logits is not None
        return logits

    shared_logits, logits = prefill(folder, True), prefill(bundle / GRAPHS_DIR, False)
    assert np.array_equal(shared_logits, logits)  # the same graph, compiled alike: so its greedy token too
