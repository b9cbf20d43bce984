"""The hook through which a models file tells /v1/models what the model store does not know:
each model's aliases, its default request settings, whether it is listed, and where that came from.

Kept apart from gateway/http/model_view.py (which imports Services) so that gateway/http/services.py can
import it without a cycle. A provider is any object with these four methods; `NO_FACTS`, the
default, says nothing: no aliases, no defaults, nothing hidden, no source.
"""

from __future__ import annotations

from typing import Any, Protocol


class ModelFacts(Protocol):
    def aliases(self, model_id: str) -> list[str]:
        """Other names requests may use for the model (the store resolves them; this only lists them)."""
        ...

    def defaults(self, model_id: str) -> dict[str, Any]:
        """Request settings applied when a request does not set them, e.g. {"nctx": 8192, "temperature": 0.6}.
        An int `nctx` is what /v1/models reports as `served_context`, a `compute` its `compute`."""
        ...

    def hidden(self, model_id: str) -> bool:
        """True: left out of GET /v1/models' list (GET /v1/models/{id} still answers for it)."""
        ...

    def source(self, model_id: str) -> str | None:
        """Where the model's aliases and defaults come from, e.g. "/etc/geniex/models.toml [models.qwen]"."""
        ...


class NoFacts:
    """The default provider: no models file."""

    def aliases(self, model_id: str) -> list[str]:
        return []

    def defaults(self, model_id: str) -> dict[str, Any]:
        return {}

    def hidden(self, model_id: str) -> bool:
        return False

    def source(self, model_id: str) -> str | None:
        return None


NO_FACTS: ModelFacts = NoFacts()


def facts_of(services: object) -> ModelFacts:
    """The provider `services` carries as its `facts` attribute, or NO_FACTS while it carries none."""
    facts = getattr(services, "facts", None)
    return facts if facts is not None else NO_FACTS
