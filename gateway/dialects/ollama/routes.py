"""Ollama's native API (`/api/*`), one more dialect at the edge: docs/ollama.md.

Chat and generate (gateway/dialects/ollama/chat.py) run through the same chat plan, worker path and
accounting as `/v1/chat/completions`; the model routes (gateway/dialects/ollama/models.py) read the
store and the pool; the root probe wraps the app (gateway/dialects/ollama/root.py); `/api/pull` is gateway/dialects/geniex/pull.py's. Errors are `{"error": "..."}` with the
status, as Ollama sends them, and API keys are asked for as on every other route.
"""

from __future__ import annotations

from litestar.types import ControllerRouterHandler

from gateway.dialects.ollama import chat as ollama_chat
from gateway.dialects.ollama import models as ollama_models

handlers: list[ControllerRouterHandler] = [*ollama_chat.handlers, *ollama_models.handlers]
