import pytest

from workers.engines.llama.chat_template import ChatTemplate, TemplateError

QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def test_enable_thinking_reaches_the_template() -> None:
    t = ChatTemplate(QWEN3_LIKE, bos_token="", eos_token="<|im_end|>")
    msgs = [{"role": "user", "content": "hi"}]
    assert "<think>" in t.render(msgs, {"enable_thinking": False, "enable_think": False})
    assert "<think>" not in t.render(msgs, {"enable_thinking": True, "enable_think": True})
    assert "<think>" not in t.render(msgs)


def test_raise_exception_becomes_template_error() -> None:
    t = ChatTemplate("{{ raise_exception('roles must alternate') }}", bos_token="", eos_token="")
    with pytest.raises(TemplateError, match="alternate"):
        t.render([{"role": "user", "content": "x"}])


def test_fallback_is_chatml() -> None:
    t = ChatTemplate(None, bos_token="", eos_token="")
    assert t.render([{"role": "user", "content": "x"}]).endswith("<|im_start|>assistant\n")
    assert not t.is_native


def test_template_cannot_reach_python_internals() -> None:
    t = ChatTemplate("{{ messages.__class__.__mro__ }}", bos_token="", eos_token="")
    with pytest.raises(TemplateError):
        t.render([{"role": "user", "content": "x"}])


# A Hermes/Qwen2.5-style template that knows tools (trimmed to what matters here).
TOOL_AWARE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
HISTORY = [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]  # fmt: skip


def test_tool_aware_template_gets_the_tools_and_the_history() -> None:
    t = ChatTemplate(TOOL_AWARE, bos_token="", eos_token="")
    assert t.supports_tools
    out = t.render(HISTORY, None, [TOOL])
    assert '<tools>{"type": "function"' in out
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in out
    assert "<|im_start|>tool\nsunny" in out


def test_template_without_tools_gets_a_system_prompt_and_plain_turns() -> None:
    t = ChatTemplate(None, bos_token="", eos_token="")
    assert not t.supports_tools
    out = t.render(HISTORY, None, [TOOL])
    assert out.startswith("<|im_start|>system\n") and '"name": "get_weather"' in out.split("<|im_end|>")[0]
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in out
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>" in out
    # An existing system turn is extended, not duplicated.
    out = t.render([{"role": "system", "content": "Be brief."}, *HISTORY], None, [TOOL])
    assert out.count("<|im_start|>system") == 1 and out.startswith("<|im_start|>system\nBe brief.\n\n")


def test_a_prompt_that_opened_think_is_detected() -> None:
    from workers.engines.llama.chat_template import opens_reasoning

    assert opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opens_reasoning("<|im_start|>assistant\n")


def test_the_tool_call_syntax_a_template_teaches() -> None:
    from workers.engines.llama.chat_template import ChatTemplate, tool_call_format

    assert tool_call_format("{% if tools %}<tool_call>{{ tools }}{% endif %}") == "hermes"
    assert tool_call_format("{% if tools %}[TOOL_CALLS]{% endif %}") == "mistral"
    assert tool_call_format("{{ '<|python_tag|>' }}{{ tools }}") == "llama3"
    assert tool_call_format("{{ messages }}") == ""
    # a template that knows no tools is taught Hermes by the worker's own tool prompt
    assert ChatTemplate("{{ messages }}", bos_token="", eos_token="").tool_format == "hermes"
