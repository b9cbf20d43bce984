import pytest

from workers.chat_template import ChatTemplate, TemplateError

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
