"""Renders chat messages with the model's own Jinja chat template (from the GGUF)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from markupsafe import Markup

# ChatML, for models that ship no template (base models).
FALLBACK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# For templates that know nothing of tools: describe them in the system turn, in the
# Hermes format the gateway's tool-call parser reads back.
TOOLS_PROMPT = (
    "You may call one or more functions to help with the user's request. The functions are:\n"
    "{tools}\n"
    "To call a function, answer with one line per call, exactly like this and nothing else:\n"
    '<tool_call>{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}</tool_call>'
)


class TemplateError(ValueError):
    """The template refused the conversation (e.g. `raise_exception` on bad role order)."""


def _raise(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str, eos_token: str) -> None:
        self.is_native = source is not None
        # Tool-aware templates (Qwen, Llama 3.x, Mistral, Hermes...) read a `tools` variable.
        self.supports_tools = source is not None and "tools" in source
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        # As transformers renders them: keys in their order (Jinja's own tojson sorts them,
        # which would show a model `{"arguments": ..., "name": ...}` calls it never saw).
        env.filters["tojson"] = _tojson
        self._template = env.from_string(source or FALLBACK_TEMPLATE)
        # Without tool support of its own the template gets TOOLS_PROMPT, which teaches Hermes.
        self.tool_format = tool_call_format(source) if self.supports_tools else "hermes"
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[dict[str, Any]], variables: dict[str, Any] | None = None,
               tools: list[dict[str, Any]] | None = None) -> str:  # fmt: skip
        if not self.supports_tools:
            messages = _inline_tools(messages, tools)
        ctx: dict[str, Any] = {
            "messages": messages,
            "add_generation_prompt": True,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        ctx.update(variables or {})
        if tools and self.supports_tools:
            ctx["tools"] = tools
        try:
            return self._template.render(**ctx)
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed: {exc}") from exc


# The markup each tool-call syntax uses, as a tool-aware template spells it out to the model.
TOOL_FORMAT_MARKERS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "llama3": "<|python_tag|>"}


def opens_reasoning(prompt: str) -> bool:
    """The rendered prompt ends inside a `<think>` block it opened (the template forces thinking on)."""
    return prompt.rstrip().endswith("<think>")


def tool_call_format(source: str | None) -> str:
    """The tool-call syntax a chat template teaches its model, or "" when it names none."""
    for name, marker in TOOL_FORMAT_MARKERS.items():
        if source and marker in source:
            return name
    return ""


def _tojson(value: Any, indent: int | None = None) -> Markup:
    return Markup(json.dumps(value, ensure_ascii=False, indent=indent))


def _inline_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The conversation in plain turns, for a template without tool support: the tool list
    joins the system turn, past calls become `<tool_call>` text, results become user turns."""
    out: list[dict[str, Any]] = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            text = "\n".join(
                "<tool_call>"
                + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
                + "</tool_call>"
                for c in calls
            )
            content = m.get("content") or ""
            m = {"role": "assistant", "content": f"{content}\n{text}" if content else text}
        elif m.get("role") == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
        out.append(m)
    if tools:
        listing = "\n".join(json.dumps(t.get("function", t)) for t in tools)
        prompt = TOOLS_PROMPT.format(tools=listing)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
