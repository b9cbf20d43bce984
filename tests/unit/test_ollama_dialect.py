"""Ollama's dialect at the edge, without a server: options and keep_alive read into the chat
request, messages (images, tool calls and their results) translated, the short-name rule, the
copies file, and the answer's lines (thinking apart, tool calls whole with object arguments)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gateway.chat.convert import Shape
from gateway.chat.shape import ChoiceShaper
from gateway.dialects.ollama.chat import OllamaLines, chat_line, generate_line
from gateway.dialects.ollama.options import chat_fields, keep_alive_s
from gateway.dialects.ollama.translate import Clock, chat_request, generate_request, messages_of, raw_request
from gateway.errors import BadRequest
from gateway.models.copies import Copies, check_name
from gateway.models.ollama_names import pick, plain_name, short_matches
from gateway.models.store import ModelEntry
from protocol import chat
from protocol import ollama as o
from protocol.limits import MAX_STOP
from protocol.wire import Done

PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


@pytest.mark.parametrize(("given", "seconds"), [
    (None, None), (0, 0.0), (300, 300.0), ("300", 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("1.5h", 5400.0),
    ("250ms", 0.25), ("-1", -1.0), (-5, -1.0), ("-1m", -1.0), ("0s", 0.0),
])  # fmt: skip
def test_keep_alive_reads_numbers_and_go_durations(given: float | str | None, seconds: float | None) -> None:
    assert keep_alive_s(given) == seconds


@pytest.mark.parametrize("given", ["9999999h", "soon", "5 m", "1e400", "", "m5", float("inf"), 10**9])
def test_keep_alive_refuses_what_is_not_a_bounded_duration(given: float | str) -> None:
    with pytest.raises(BadRequest, match="keep_alive"):
        keep_alive_s(given)


def test_options_map_to_chat_fields_and_unhonoured_ones_are_only_logged() -> None:
    fields = chat_fields({"temperature": 0.2, "top_k": 5, "num_predict": 32, "num_ctx": 4096, "stop": ["\n"],
                          "repeat_penalty": 1.1, "seed": 7, "num_gpu": 99, "num_thread": 4, "mirostat": 2})  # fmt: skip
    assert fields == {"temperature": 0.2, "top_k": 5, "max_tokens": 32, "nctx": 4096, "stop": ["\n"],
                      "repetition_penalty": 1.1, "seed": 7, "ngl": 99}  # fmt: skip
    assert chat_fields({"num_predict": -1, "num_gpu": -1}) == {}  # Ollama's "no limit" and "you choose"
    # A name Ollama does not define is ignored, as Ollama ignores it (Open WebUI passes a model's own settings).
    assert chat_fields({"reasoning_effort": "low", "logit_bias": {"1": 2}, "temperature": 0.5}) == {"temperature": 0.5}


@pytest.mark.parametrize(("options", "field"), [
    ({"temperature": "hot"}, "options.temperature"), ({"top_k": 1.5}, "options.top_k"),
    ({"stop": [1]}, "options.stop"), ({"temperature": {"a": {"b": {}}}}, "options.temperature"),
    ({"num_ctx": 0}, "options.num_ctx"), ({"num_ctx": 2**40}, "options.num_ctx"),
    ({"stop": ["x"] * (MAX_STOP + 1)}, "options.stop"),
])  # fmt: skip
def test_bad_options_are_refused_naming_the_option(options: dict[str, object], field: str) -> None:
    with pytest.raises(BadRequest, match=f"`{field}`"):
        chat_fields(options)


def test_a_chat_field_out_of_range_is_named_as_the_ollama_option() -> None:
    req = o.OllamaChatRequest(
        model="m", messages=[o.OllamaMessage(role="user", content="hi")], options={"temperature": 9}
    )
    with pytest.raises(BadRequest, match=r"`options\.temperature`"):
        chat_request(req, None)


def test_messages_translate_images_tool_calls_and_their_results() -> None:
    msgs = messages_of([
        o.OllamaMessage(role="user", content="what is this?", images=[PNG_B64]),
        o.OllamaMessage(role="assistant", content="", tool_calls=[
            o.OllamaToolCall(o.ToolCallFunction("a", {"x": 1})), o.OllamaToolCall(o.ToolCallFunction("b", {}))]),
        o.OllamaMessage(role="tool", content="B!", tool_name="b"),
        o.OllamaMessage(role="tool", content="A!"),
    ])  # fmt: skip
    parts = msgs[0].content
    assert isinstance(parts, list) and parts[0].image_url is not None
    assert parts[0].image_url.url.startswith("data:image/png;base64,") and parts[1].text == "what is this?"
    calls = msgs[1].tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in calls] == [("a", '{"x": 1}'), ("b", "{}")]
    # a result answers the call of its tool_name; one without a name, the earliest unanswered call
    assert (msgs[2].tool_call_id, msgs[3].tool_call_id) == (calls[1].id, calls[0].id)
    with pytest.raises(BadRequest, match="images"):
        messages_of([o.OllamaMessage(role="assistant", content="x", images=[PNG_B64])])


def test_format_think_and_generate_become_the_chat_request() -> None:
    base = o.OllamaChatRequest(model="m", messages=[o.OllamaMessage(role="user", content="hi")])
    as_json = chat_request(msgspec.structs.replace(base, format="json"), None)
    assert as_json.response_format == {"type": "json_object"}
    schema = {"type": "object"}
    assert chat_request(msgspec.structs.replace(base, format=schema), None).response_format == {
        "type": "json_schema", "json_schema": {"name": "format", "schema": schema}}  # fmt: skip
    with pytest.raises(BadRequest, match="format"):
        chat_request(msgspec.structs.replace(base, format="yaml"), None)
    thinking = chat_request(msgspec.structs.replace(base, think=True), 60.0)
    assert thinking.enable_think is True and thinking.reasoning_format == "deepseek" and thinking.keep_alive == 60.0
    assert chat_request(msgspec.structs.replace(base, think=False), None).enable_think is False
    forced = chat_request(msgspec.structs.replace(base, tools=[o.OllamaTool(o.ToolFunction("f"))]), None, "f")
    assert forced.tool_choice == {"type": "function", "function": {"name": "f"}}
    with pytest.raises(BadRequest, match="header"):
        chat_request(base, None, "g")
    g = generate_request(o.GenerateRequest(model="m", prompt="hi", system="be brief", images=[PNG_B64]), None)
    assert [m.role for m in g.messages] == ["system", "user"] and isinstance(g.messages[1].content, list)
    with pytest.raises(BadRequest, match="raw"):
        raw_request(o.GenerateRequest(model="m", prompt="x", raw=True, format="json"))
    assert raw_request(o.GenerateRequest(model="m", prompt="x", raw=True, options={"num_predict": 3})).max_tokens == 3


def entry(org: str, repo: str, precision: str, size: int = 1) -> ModelEntry:
    return ModelEntry(id=f"{org}/{repo}:{precision}", org=org, repo=repo, precision=precision, engine="llama_cpp",
                      path=f"/m/{repo}.gguf", size=size, created=0)  # fmt: skip


def test_short_names_match_one_repository_or_say_which_they_could_mean() -> None:
    smol = [entry("HuggingFaceTB", "SmolLM2-135M-Instruct", "Q4_1"), entry("HuggingFaceTB", "SmolLM2-135M-Instruct",
                                                                          "Q8_0", 2)]  # fmt: skip
    vision = entry("test", "smol-vision", "Q4_1")
    qwen = entry("Qwen", "Qwen3-0.6B-GGUF", "Q4_K_M")
    entries = [*smol, vision, qwen]
    assert plain_name("hf.co/a/b:latest") == "a/b" and plain_name("x:latest") == "x"
    assert pick(short_matches(entries, "smollm2"), "smollm2") == smol[1]  # the store's preferred precision (Q8_0)
    assert pick(short_matches(entries, "smollm2:q4_1"), "smollm2:q4_1") == smol[0]
    assert pick(short_matches(entries, "smollm2:135m"), "smollm2:135m") in smol
    assert pick(short_matches(entries, "qwen3:latest"), "qwen3:latest") == qwen
    assert pick(short_matches(entries, "smollm2:1.7b"), "smollm2:1.7b") == ""  # no such word: nothing
    assert pick(short_matches(entries, "smollm"), "smollm") == ""  # not at a word boundary
    assert pick(short_matches(entries, "smol"), "smol") == vision  # "smol" ends a word of smol-vision only
    bigger = entry("HuggingFaceTB", "SmolLM2-360M-Instruct", "Q8_0")
    ambiguous = pick(short_matches([*entries, bigger], "smollm2"), "smollm2")
    assert isinstance(ambiguous, str) and "SmolLM2-135M-Instruct" in ambiguous and "SmolLM2-360M" in ambiguous
    assert pick(short_matches([*entries, bigger], "smollm2:360m"), "smollm2:360m") == bigger


def test_copies_persist_as_names_only_and_refuse_path_like_names(tmp_path: Path) -> None:
    path = tmp_path / "aliases.json"
    c = Copies(path)
    c.add("my-model", "a/b:Q4_0")
    assert Copies(path).target("MY-MODEL") == "a/b:Q4_0" and Copies(path).items() == [("my-model", "a/b:Q4_0")]
    assert c.remove("my-model") and not c.remove("my-model") and Copies(path).target("my-model") is None
    for bad in ("../x", "/etc/passwd", ".hidden", "a//b", "http://x/y", "a\x00b", "x" * 200, ""):
        with pytest.raises(BadRequest):
            check_name(bad)
    path.write_text("{not json")
    assert Copies(path).items() == []  # a damaged file names nothing


def _feed(render: OllamaLines, shaper: ChoiceShaper, texts: list[str]) -> list[msgspec.Struct]:
    out: list[msgspec.Struct] = []
    for t in texts:
        piece = shaper.feed(t)
        if piece is not None:
            out += render.piece(piece[0], 1)
    tail = shaper.finish()
    if tail is not None:
        out += render.piece(tail[0], 1)
    out += render.close()
    usage = chat.Usage(prompt_tokens=5, completion_tokens=len(texts), total_tokens=5 + len(texts))
    out += render.end(shaper.finish_reason("stop"), Done(0, "stop", 5, len(texts)), usage)
    return out


def test_lines_carry_thinking_apart_and_the_done_line_its_counts() -> None:
    render = OllamaLines(chat_line("m"), Clock())
    lines = _feed(render, ChoiceShaper(0, Shape(reasoning=True)), ["<think>", "the user", " asks", "</think>", "Paris"])
    chunks = [x for x in lines if isinstance(x, o.ChatChunk)]
    assert "".join(c.message.thinking or "" for c in chunks) == "the user asks"
    assert "".join(c.message.content for c in chunks) == "Paris"
    last = chunks[-1]
    assert last.done and last.done_reason == "stop" and (last.prompt_eval_count, last.eval_count) == (5, 5)
    assert not any(c.done for c in chunks[:-1])
    assert all(
        "done" in msgspec.json.decode(msgspec.json.encode(c)) for c in chunks
    )  # raw clients read it on each line
    g = OllamaLines(generate_line("m"), Clock())
    gen = [x for x in _feed(g, ChoiceShaper(0, Shape(reasoning=True)), ["<think>hm</think>", "ok"])
           if isinstance(x, o.GenerateChunk)]  # fmt: skip
    assert "".join(c.thinking or "" for c in gen) == "hm" and "".join(c.response for c in gen) == "ok"


def test_tool_calls_go_out_whole_with_object_arguments() -> None:
    render = OllamaLines(chat_line("m"), Clock())
    shaper = ChoiceShaper(0, Shape(tools=frozenset({"get_weather"})), "hermes")
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
    lines = _feed(render, shaper, [text[i : i + 7] for i in range(0, len(text), 7)])
    calls = [c for x in lines if isinstance(x, o.ChatChunk) for c in x.message.tool_calls or []]
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert calls[0].function.arguments == {"city": "Paris", "unit": "celsius"}
    encoded = msgspec.json.decode(msgspec.json.encode(lines[-2]))
    assert encoded["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris", "unit": "celsius"}
