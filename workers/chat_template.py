"""Renders chat messages with the model's own Jinja chat template (from the GGUF)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# ChatML, for models that ship no template (base models).
FALLBACK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TemplateError(ValueError):
    """The template refused the conversation (e.g. `raise_exception` on bad role order)."""


def _raise(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str, eos_token: str) -> None:
        self.is_native = source is not None
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(source or FALLBACK_TEMPLATE)
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[dict[str, Any]], variables: dict[str, Any] | None = None) -> str:
        ctx: dict[str, Any] = {
            "messages": messages,
            "add_generation_prompt": True,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        ctx.update(variables or {})
        try:
            return self._template.render(**ctx)
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed: {exc}") from exc
