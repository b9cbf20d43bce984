"""Ollama's native API (`/api/*`), one more dialect at the edge: docs/ollama.md.

Chat and generate (gateway/api/ollama_chat.py) run through the same chat plan, worker path and
accounting as `/v1/chat/completions`; the model routes (gateway/api/ollama_models.py) read the
store and the pool; the root probe wraps the app (gateway/api/ollama_root.py); `/api/pull` is gateway/api/pull.py's. Errors are `{"error": "..."}` with the
status, as Ollama sends them, and API keys are asked for as on every other route.
"""

from __future__ import annotations

from litestar.types import ControllerRouterHandler

from gateway.api import ollama_chat, ollama_models

handlers: list[ControllerRouterHandler] = [*ollama_chat.handlers, *ollama_models.handlers]
