"""/v1/embeddings through the real server, real workers and real MiniLM (ONNX int8 and a GGUF
converted from the safetensors), with the real OpenAI SDK. Which engine covers what:
ONNX (CPU EP): shape, norms, semantics, base64, dimensions, token inputs, batching, errors;
ONNX (QNN HTP, simulated on x86): agreement with the CPU, NPU residency;
GGUF (llama.cpp, embedding context): agreement with ONNX on vectors and on the ordering.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
from tokenizers import Tokenizer

from tests.conftest import MODEL as CHAT_MODEL
from tests.embedding_models import (
    GGUF_MODEL,
    ONNX_COPY,
    ONNX_MODEL,
    data_dir_with_models,
    st_dir,
)
from tests.server_proc import ServerProcess, serving

WORDS = ["food", "bread", "galaxy"]
# QNN's HTP backend computes in fp16 (simulated here); measured against the CPU EP on MiniLM:
# max |diff| 0.0021, cosine >= 0.99994 per vector.
NPU_MAX_ABS = 5e-3
NPU_MIN_COS = 0.9998


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = data_dir_with_models(tmp_path_factory.getbasetemp() / "embedding-models")
    with serving(data, "--keep-alive-s", "120", "--qnn-simulator") as srv:  # npu: QNN's HTP simulator on x86_64
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def post(server: ServerProcess, **body: object) -> httpx.Response:
    body.setdefault("model", ONNX_MODEL)
    return httpx.post(f"{server.base_url}/v1/embeddings", json=body, timeout=120)


def matrix(body: dict) -> np.ndarray:  # type: ignore[type-arg]
    assert [d["index"] for d in body["data"]] == list(range(len(body["data"])))
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


def workers(server: ServerProcess) -> list[dict]:  # type: ignore[type-arg]
    return httpx.get(f"{server.base_url}/v1/workers").json()["data"]


def test_minilm_vectors_are_unit_norm_and_semantic(client: openai.OpenAI) -> None:
    r = client.embeddings.create(model=ONNX_MODEL, input=WORDS, encoding_format="float")
    assert r.object == "list" and r.model == ONNX_MODEL and len(r.data) == 3
    assert all(d.object == "embedding" for d in r.data) and [d.index for d in r.data] == [0, 1, 2]
    v = np.array([d.embedding for d in r.data])
    assert v.shape == (3, 384)
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    food, bread, galaxy = v
    assert food @ bread > food @ galaxy
    assert r.usage.prompt_tokens == 9 == r.usage.total_tokens  # [CLS] word [SEP], three times


def test_sdk_default_path_and_single_string(client: openai.OpenAI, server: ServerProcess) -> None:
    # Without encoding_format the SDK asks for base64 and decodes it itself.
    sdk = client.embeddings.create(model=ONNX_MODEL, input="food").data[0].embedding
    plain = matrix(post(server, input="food").json())[0]
    assert np.array_equal(np.array(sdk, dtype=np.float32), plain)


def test_base64_decodes_to_the_float_vector(server: ServerProcess) -> None:
    floats = matrix(post(server, input=WORDS).json())
    body = post(server, input=WORDS, encoding_format="base64").json()
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in body["data"]])
    assert np.array_equal(decoded, floats)


def test_dimensions_truncate_and_renormalise(server: ServerProcess) -> None:
    full = matrix(post(server, input=WORDS).json())
    cut = matrix(post(server, input=WORDS, dimensions=64).json())
    assert cut.shape == (3, 64)
    assert np.allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-5)
    expected = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    assert np.abs(cut - expected).max() < 1e-5


def test_token_id_inputs_match_text(server: ServerProcess) -> None:
    tok = Tokenizer.from_file(str(st_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    ids = [tok.encode(w).ids for w in WORDS]
    text = matrix(post(server, input=WORDS).json())
    one = post(server, input=ids[0]).json()
    assert one["usage"]["prompt_tokens"] == len(ids[0])
    assert np.abs(matrix(one)[0] - text[0]).max() < 1e-5
    assert np.abs(matrix(post(server, input=ids).json()) - text).max() < 1e-5


def test_a_list_is_batched_and_answered_in_order(server: ServerProcess) -> None:
    texts = [f"sentence number {i} " + "word " * (i % 7) for i in range(40)]
    r = post(server, input=texts)
    assert r.status_code == 200, r.text
    batched = matrix(r.json())
    singles = np.stack([matrix(post(server, input=t).json())[0] for t in texts[:5]])
    assert np.abs(batched[:5] - singles).max() < 1e-4  # padding in a batch changes nothing but rounding
    # One worker request for the 40 inputs (the worker logs one line per request it answered).
    assert "sequences=40" in server.log() or '"sequences": 40' in server.log()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"input": ""}, "empty string"),
        ({"input": []}, "must not be empty"),
        ({"input": ["a", ""]}, "`input`[1]"),
        ({"input": ["a", 1]}, "list of strings"),
        ({"input": [[101, 102], []]}, "empty token list"),
        ({"input": [[101, 10**6]]}, "outside the vocabulary"),
        ({"input": [-1]}, "outside the vocabulary"),
        ({"input": "x", "dimensions": 0}, "`dimensions`"),
        ({"input": "x", "dimensions": 385}, "between 1 and 384"),
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({}, "input"),
        ({"input": "word " * 300}, "at most 256"),
        ({"input": "x", "model": CHAT_MODEL}, "does not support embeddings; models that do:"),
    ],
)
def test_bad_input_is_400(server: ServerProcess, body: dict, words: str) -> None:  # type: ignore[type-arg]
    r = post(server, **body)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]


def test_unknown_model_is_404(server: ServerProcess) -> None:
    assert post(server, model="nobody/nothing", input="x").status_code == 404


def test_gguf_through_llama_cpp_agrees_with_onnx(server: ServerProcess) -> None:
    queries = ["food", "a loaf of bread", "stars in the night sky", "machine learning"]
    onnx = matrix(post(server, input=queries).json())
    gguf = matrix(post(server, model=GGUF_MODEL, input=queries).json())
    assert np.allclose(np.linalg.norm(gguf, axis=1), 1.0, atol=1e-5)
    # int8 ONNX vs f32 GGUF of the same weights: the same vectors up to quantisation...
    assert ((onnx * gguf).sum(axis=1) > 0.99).all()
    # ...and the same ordering of every similarity.
    assert (np.argsort(-(onnx @ onnx.T), axis=1) == np.argsort(-(gguf @ gguf.T), axis=1)).all()
    row = next(w for w in workers(server) if w["model"] == GGUF_MODEL)
    assert (row["engine"], row["provider"]) == ("llama_cpp", "llama.cpp")


def test_npu_qnn_htp_agrees_with_cpu_and_is_resident_alone(server: ServerProcess) -> None:
    texts = ["food", "The quick brown fox jumps over the lazy dog"]
    cpu = matrix(post(server, input=texts, compute="cpu").json())
    r = post(server, input=texts, compute="npu")
    assert r.status_code == 200, r.text
    npu = matrix(r.json())
    assert np.abs(npu - cpu).max() < NPU_MAX_ABS
    assert ((npu * cpu).sum(axis=1) > NPU_MIN_COS).all()
    by_unit = {w["compute"]: w for w in workers(server) if w["model"] == ONNX_MODEL}
    assert by_unit["npu"]["provider"] == "QNNExecutionProvider"
    assert by_unit["cpu"]["provider"] == "CPUExecutionProvider"
    # Loading another NPU model first evicts the NPU worker already there (the NPU is one small device).
    assert post(server, model=ONNX_COPY, input="food", compute="npu").status_code == 200
    npu_models = {w["model"] for w in workers(server) if w["compute"] == "npu" and w["state"] in ("idle", "busy")}
    assert npu_models == {ONNX_COPY}
