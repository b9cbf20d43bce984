"""`compute: npu` chat through the real server, on QNN's HTP simulator (x86_64), against `compute: cpu`.

Slow (about 1.5 min on a busy 2-core box): a simulated decode step takes seconds and building the
two QNN sessions tens of seconds, so the requests are a few tokens. The converted graph is the one
the converter's tests made this session, hard-linked into the server's data dir (the conversion
itself is tested in test_npu_convert.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.conftest import MODEL
from tests.npu_models import converted
from tests.server_proc import ServerProcess, serving

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("onnxruntime_qnn") is None, reason="needs onnxruntime-qnn"),
]

# A short system turn keeps the prompt within one 32-token prefill chunk.
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("npu-data")
    folder = converted(tmp_path_factory)
    target = data / "npu" / folder.name
    target.mkdir(parents=True)
    for f in folder.iterdir():
        os.link(f, target / f.name)  # the 650 MB graph, without a copy
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


def test_what_the_npu_engine_lacks_is_a_400_naming_it(server: ServerProcess) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1, "compute": "npu", "logprobs": True}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=600)
    assert r.status_code == 400 and "NPU engine" in r.json()["error"], r.text
