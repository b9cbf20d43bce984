"""GET /openapi.json: the API as OpenAPI 3.1, built from the msgspec structs the handlers decode.

Litestar's own generator is not used: every handler takes the raw body (`body: bytes`, decoded by
`read_json` so that errors name the field the client's way), so Litestar sees no request schemas
at all, and it would name components after our structs. Here each route is listed with the struct
it reads and writes; msgspec writes their JSON Schemas; components are renamed to the names of
`../shared/spec` (ChatRequest is `ChatCompletionRequest` there, chat's Usage `TokenUsage`, ...).
What the spec does not have is marked `x-geniex-extension: true`: whole operations (also tagged
"GenieX extensions"), schemas the spec does not name, and fields the spec's schemas do not list.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

import msgspec
from litestar import Response, get

from gateway.dialects.geniex.health import WorkerTable
from gateway.dialects.geniex.mcp import McpServers
from gateway.ops.ledger import UsageList
from protocol import (
    anthropic,
    chat,
    completions,
    conversations,
    cv,
    diarize,
    embeddings,
    events,
    images,
    logits,
    models,
    ollama,
    pull,
    responses,
    speech,
)
from protocol import tokens as tok
from protocol.errors import ErrorResponse
from protocol.transcriptions import TranscriptionForm

EXT = "x-geniex-extension"
EVENT_STREAM = "text/event-stream"
REF = "#/components/schemas/"

# The spec's schemas and their fields (openapi-current.yaml, and the earlier full spec for
# embeddings, reranking and CV); tests/unit/test_webui.py checks this table against the spec
# (tests/fuzz/contract, the project's copy of ../shared/spec).
SPEC_FIELDS: dict[str, frozenset[str]] = {
    "ForwardLogitsRequest": frozenset({"compute", "input_ids", "last_only", "model", "nctx", "ngl", "top_n"}),
    "ForwardLogitsResponse": frozenset({"model", "n_rows", "rows", "top_n", "vocab_size"}),
    "ChatCompletionRequest": frozenset(
        {
            "compute",
            "enable_json",
            "enable_think",
            "frequency_penalty",
            "grammar_path",
            "grammar_string",
            "image_max_length",
            "max_completion_tokens",
            "messages",
            "min_p",
            "model",
            "nctx",
            "ngl",
            "presence_penalty",
            "repetition_penalty",
            "spec_draft_model",
            "spec_n_max",
            "spec_n_min",
            "spec_p_min",
            "spec_type",
            "stream",
            "stream_options",
            "temperature",
            "tools",
            "top_k",
            "top_p",
        }
    )
    | frozenset({"max_tokens", "reasoning_format"}),
    "ChatMessage": frozenset({"content", "function_call", "name", "role", "tool_calls"}),
    "ChatMessageContent": frozenset({"image_url", "input_audio", "text", "type"}),
    "ChatMessageImageURL": frozenset({"detail", "url"}),
    "ChatMessageAudioURL": frozenset({"data"}),
    "ChatCompletionTool": frozenset({"function", "type"}),
    "ChatCompletionToolFunction": frozenset({"description", "name", "parameters"}),
    "ChatCompletionToolChoice": frozenset({"function", "type"}),
    "ChatCompletionMessageToolCall": frozenset({"function", "id", "type"}),
    "ChatCompletionMessageToolCallFunction": frozenset({"arguments", "name"}),
    "ChatCompletionMessageFunctionCall": frozenset({"arguments", "name"}),
    "ChatCompletionResponse": frozenset({"choices", "created", "id", "model", "object", "usage"}),
    "ChatChoice": frozenset({"finish_reason", "index", "logprobs", "message"}),
    "ChatCompletionChoiceLogprobs": frozenset({"content"}),
    "ChatCompletionTokenLogprob": frozenset({"bytes", "logprob", "token", "top_logprobs"}),
    "ChatCompletionTokenLogprobTopLogprob": frozenset({"bytes", "logprob", "token"}),
    "ErrorResponse": frozenset({"error"}),
    "TokenUsage": frozenset({"completion_tokens", "prompt_tokens", "total_tokens"}),
    "ModelsListResponse": frozenset({"data", "object"}),
    "ModelResponse": frozenset({"created", "id", "object", "owned_by", "permission"}),
    "Model": frozenset({"id", "owned_by"}),
    "EmbeddingRequest": frozenset({"dimensions", "encoding_format", "input", "model", "task_type", "user"}),
    "EmbeddingResponse": frozenset({"data", "model", "object", "usage"}),
    "EmbeddingVector": frozenset({"embedding", "index", "object"}),
    "RerankingRequest": frozenset({"batch_size", "documents", "model", "normalize", "normalize_method", "query"}),
    "RerankingResponse": frozenset({"result"}),
    "CVRequest": frozenset({"image", "model"}),
    "CVResponse": frozenset({"results"}),
    "CVResult": frozenset({"bbox", "confidence", "label"}),
}
# Named in the earlier full spec (its flattened text lists no fields we could check here).
SPEC_NAMES_EARLIER = frozenset({
    "AudioDiarizeRequest", "AudioDiarizeResponse", "AudioSpeechRequest", "AudioTranscriptionRequest",
    "AudioTranscriptionResponse", "DiarizeSegment", "ImageGenerationData", "ImageGenerationRequest",
    "ImageGenerationResponse",
})  # fmt: skip

# msgspec's component name (module-qualified where two structs share a name) -> the spec's name.
RENAME = {
    "ChatRequest": "ChatCompletionRequest",
    "ContentPart": "ChatMessageContent",
    "ImageURL": "ChatMessageImageURL",
    "InputAudio": "ChatMessageAudioURL",
    "Tool": "ChatCompletionTool",
    "FunctionDef": "ChatCompletionToolFunction",
    "ToolCall": "ChatCompletionMessageToolCall",
    "protocol.chat.FunctionCall": "ChatCompletionMessageToolCallFunction",
    "ChatCompletion": "ChatCompletionResponse",
    "Choice": "ChatChoice",
    "ChoiceLogprobs": "ChatCompletionChoiceLogprobs",
    "TokenLogprob": "ChatCompletionTokenLogprob",
    "TopLogprob": "ChatCompletionTokenLogprobTopLogprob",
    "protocol.chat.Usage": "TokenUsage",
    "protocol.errors.ErrorResponse": "ErrorResponse",
    "LogitsRequest": "ForwardLogitsRequest",
    "LogitsResponse": "ForwardLogitsResponse",
    "ModelList": "ModelsListResponse",
    "Embedding": "EmbeddingVector",
    "SpeechRequest": "AudioSpeechRequest",
    "TranscriptionForm": "AudioTranscriptionRequest",
    "DiarizeRequest": "AudioDiarizeRequest",
    "DiarizeResponse": "AudioDiarizeResponse",
    "ImageData": "ImageGenerationData",
}

JSON = "application/json"
NDJSON = "application/x-ndjson"


class Op(msgspec.Struct, frozen=True):
    method: str
    path: str
    summary: str
    request: Any = None  # a msgspec type, read as JSON (or the form, for transcriptions)
    response: Any = None  # a msgspec type answered as JSON
    operation_id: str | None = None  # the spec's operationId: set only on the spec's operations
    tag: str = "GenieX extensions"
    response_media: str = JSON
    streams: bool = False  # `stream: true` answers Server-Sent Events
    ndjson: bool = False  # Ollama's routes: `stream` (true by default) answers newline-delimited JSON


def _ops() -> list[Op]:
    return [
        Op(
            "post",
            "/v1/chat/completions",
            "Creates a model response for the given chat conversation",
            chat.ChatRequest,
            chat.ChatCompletion,
            "PostV1ChatCompletions",
            "Chat",
            streams=True,
        ),
        Op(
            "post",
            "/v1/logits",
            "Raw logits from a single prefill-only forward pass",
            logits.LogitsRequest,
            logits.LogitsResponse,
            "PostV1Logits",
            "Chat",
        ),
        Op(
            "get", "/v1/models", "Lists the currently available models", None, models.ModelList, "GetV1Models", "Models"
        ),
        Op(
            "get",
            "/v1/models/{model}",
            "Retrieves a model instance",
            None,
            "ModelResponse",
            "GetV1ModelsModel",
            "Models",
        ),
        Op(
            "post",
            "/v1/embeddings",
            "Creates an embedding for the given input",
            embeddings.EmbeddingRequest,
            embeddings.EmbeddingResponse,
            "PostV1Embeddings",
            "Embeddings",
        ),
        Op(
            "post",
            "/v1/reranking",
            "Rerank documents based on their relevance to a query",
            embeddings.RerankingRequest,
            embeddings.RerankingResponse,
            "PostV1Reranking",
            "Embeddings",
        ),
        Op(
            "post",
            "/v1/cv",
            "Performs computer vision analysis on images (OCR)",
            cv.CVRequest,
            cv.CVResponse,
            "PostV1CV",
            "Vision",
        ),
        Op(
            "post",
            "/v1/images/generations",
            "Creates images from a prompt",
            images.ImageGenerationRequest,
            images.ImageGenerationResponse,
            "PostV1ImagesGenerations",
            "Vision",
        ),
        Op(
            "post",
            "/v1/audio/speech",
            "Text to speech: a WAV file (or SSE of PCM chunks with stream_format sse)",
            speech.SpeechRequest,
            None,
            "PostV1AudioSpeech",
            "Audio",
            response_media="audio/wav",
        ),
        Op(
            "post",
            "/v1/audio/transcriptions",
            "Speech to text (multipart/form-data)",
            TranscriptionForm,
            "AudioTranscriptionResponse",
            "PostV1AudioTranscriptions",
            "Audio",
            streams=True,
        ),
        Op(
            "post",
            "/v1/audio/diarize",
            "Who spoke when",
            diarize.DiarizeRequest,
            diarize.DiarizeResponse,
            "PostV1AudioDiarize",
            "Audio",
        ),
        # Ours, beyond the spec.
        Op(
            "post",
            "/v1/completions",
            "Legacy text completion",
            completions.CompletionRequest,
            completions.TextCompletion,
            streams=True,
        ),
        Op(
            "post",
            "/v1/messages",
            "Anthropic's Messages API",
            anthropic.MessagesRequest,
            anthropic.Message,
            streams=True,
        ),
        Op(
            "post",
            "/v1/messages/count_tokens",
            "Anthropic's token count",
            anthropic.CountTokensRequest,
            anthropic.TokenCount,
        ),
        Op(
            "post",
            "/v1/responses",
            "OpenAI's Responses API",
            responses.ResponsesRequest,
            responses.Response,
            streams=True,
        ),
        Op("get", "/v1/responses/{response_id}", "A stored response", None, responses.Response),
        Op("post", "/v1/responses/{response_id}/cancel", "Cancel a background response", None, responses.Response),
        Op(
            "get",
            "/v1/responses/{response_id}/input_items",
            "A stored response's input items",
            None,
            conversations.ItemList,
        ),
        Op(
            "post",
            "/v1/responses/input_tokens",
            "A Responses request's input tokens",
            conversations.InputTokensRequest,
            conversations.InputTokens,
        ),
        Op(
            "post",
            "/v1/conversations",
            "Create a conversation",
            conversations.ConversationCreate,
            conversations.Conversation,
        ),
        Op("get", "/v1/conversations/{conversation_id}", "A conversation", None, conversations.Conversation),
        Op(
            "delete",
            "/v1/conversations/{conversation_id}",
            "Delete a conversation",
            None,
            conversations.ConversationDeleted,
        ),
        Op(
            "post",
            "/v1/conversations/{conversation_id}",
            "Update a conversation's metadata",
            conversations.ConversationUpdate,
            conversations.Conversation,
        ),
        Op("get", "/v1/conversations/{conversation_id}/items", "A conversation's items", None, conversations.ItemList),
        Op(
            "post",
            "/v1/conversations/{conversation_id}/items",
            "Add items to a conversation",
            conversations.ItemsCreate,
            conversations.ItemList,
        ),
        Op("get", "/v1/conversations/{conversation_id}/items/{item_id}", "A conversation's item"),
        Op(
            "delete",
            "/v1/conversations/{conversation_id}/items/{item_id}",
            "Delete a conversation's item",
            None,
            conversations.Conversation,
        ),
        Op(
            "get",
            "/v1/mcp/servers",
            "The MCP servers this key may use, with their tools (docs/mcp.md)",
            None,
            McpServers,
        ),
        Op("delete", "/v1/responses/{response_id}", "Delete a stored response", None, responses.Deleted),
        Op("post", "/v1/models/load", "Load a model now", models.LoadRequest, "ModelResponse"),
        Op(
            "post",
            "/v1/models/unload",
            "Stop a model's workers (409 while one is serving)",
            models.UnloadRequest,
            models.Unloaded,
        ),
        Op("post", "/tokenize", "Text to token ids (also under /v1/)", tok.TokenizeRequest, "TokenizeResponse"),
        Op("post", "/v1/tokenize", "Text to token ids", tok.TokenizeRequest, "TokenizeResponse"),
        Op("post", "/detokenize", "Token ids to text (also under /v1/)", tok.DetokenizeRequest, tok.DetokenizeResponse),
        Op("post", "/v1/detokenize", "Token ids to text", tok.DetokenizeRequest, tok.DetokenizeResponse),
        Op("get", "/v1/workers", "The resident workers", None, WorkerTable, tag="Operations"),
        Op(
            "get",
            "/v1/events",
            "Model and worker state changes, as Server-Sent Events (see docs/api.md)",
            None,
            events.WorkerChange,
            tag="Operations",
            response_media=EVENT_STREAM,
        ),
        Op("get", "/v1/usage", "The usage ledger per day, model, key and user", None, UsageList, tag="Operations"),
        Op(
            "post",
            "/v1/models/pull",
            "Download a Hugging Face GGUF model; progress as Server-Sent Events (docs/api.md)",
            pull.PullRequest,
            "ModelResponse",
            streams=True,
        ),
        # Ollama's API (docs/ollama.md).
        Op(
            "post",
            "/api/pull",
            "Ollama's pull: a Hugging Face GGUF, progress as NDJSON lines",
            pull.OllamaPullRequest,
            pull.PullStatus,
            tag="Ollama",
            ndjson=True,
        ),
        Op("post", "/api/chat", "Ollama's chat", ollama.OllamaChatRequest, ollama.ChatChunk, tag="Ollama", ndjson=True),
        Op(
            "post",
            "/api/generate",
            "Ollama's completion (`raw`, `suffix`: a raw prompt)",
            ollama.GenerateRequest,
            ollama.GenerateChunk,
            tag="Ollama",
            ndjson=True,
        ),
        Op("post", "/api/embed", "Ollama's embeddings", ollama.EmbedRequest, ollama.EmbedResponse, tag="Ollama"),
        Op(
            "post",
            "/api/embeddings",
            "Ollama's older embeddings (one `prompt`)",
            ollama.EmbeddingsRequest,
            ollama.EmbeddingsResponse,
            tag="Ollama",
        ),
        Op("get", "/api/tags", "The models, Ollama's list", None, ollama.Tags, tag="Ollama"),
        Op(
            "post",
            "/api/show",
            "A model's details, template and capabilities",
            ollama.ModelRequest,
            ollama.Show,
            tag="Ollama",
        ),
        Op("get", "/api/ps", "The loaded models", None, ollama.Running, tag="Ollama"),
        Op("get", "/api/version", "The Ollama API version this server follows", None, ollama.Version, tag="Ollama"),
        Op("post", "/api/copy", "A new name for a model (an alias)", ollama.CopyRequest, None, tag="Ollama"),
        Op(
            "delete", "/api/delete", "Delete a copy's name, or a model's files", ollama.ModelRequest, None, tag="Ollama"
        ),
        Op("get", "/health", "Liveness", None, "Status", tag="Operations"),
        Op("get", "/ready", "Readiness (503 while preloading or draining)", None, "Status", tag="Operations"),
        Op("get", "/metrics", "Prometheus metrics", None, None, tag="Operations", response_media="text/plain"),
    ]


# Schemas the structs do not give: written here in the spec's terms.
HAND_WRITTEN: dict[str, dict[str, Any]] = {
    "ChatCompletionToolChoice": {
        "type": "object",
        "description": "`tool_choice` as an object; the field also takes `auto`, `none` or `required`",
        "properties": {
            "type": {"type": "string", "enum": ["function"]},
            "function": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
        },
        "required": ["type", "function"],
    },
    "ChatCompletionMessageFunctionCall": {"$ref": REF + "ChatCompletionMessageToolCallFunction"},
    "ModelResponse": {"$ref": REF + "Model"},
    "AudioTranscriptionResponse": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "description": "response_format json; text, srt and vtt answer text, verbose_json adds segments",
    },
    # msgspec cannot describe `list[int] | list[Piece]`: written out.
    "TokenizeResponse": {
        "type": "object",
        "required": ["tokens"],
        "properties": {
            "tokens": {
                "anyOf": [
                    {"type": "array", "items": {"type": "integer"}},
                    {"type": "array", "items": {"$ref": REF + "Piece"}},
                ]
            }
        },
    },
    "Status": {
        "type": "object",
        "properties": {
            "status": {"type": "string"},
            "recovering": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "/ready: models whose last worker crashed or hung, and why, until a new one is ready",
            },
        },
        "required": ["status"],
    },
}


def _dotted(name: str) -> str:
    """`protocol.anthropic.ErrorResponse` -> `AnthropicErrorResponse`."""
    module, _, cls = name.rpartition(".")
    return module.rpartition(".")[2].title().replace("_", "") + cls


def _rewrite_refs(node: Any, names: dict[str, str]) -> Any:
    if isinstance(node, dict):
        out = {k: _rewrite_refs(v, names) for k, v in node.items()}
        ref = out.get("$ref")
        if isinstance(ref, str) and ref.startswith(REF):
            out["$ref"] = REF + names.get(ref[len(REF) :], ref[len(REF) :])
        return out
    if isinstance(node, list):
        return [_rewrite_refs(v, names) for v in node]
    return node


def _mark_extensions(schemas: dict[str, Any]) -> None:
    for name, schema in schemas.items():
        if name in SPEC_FIELDS:
            # The spec's Model (list items) and ModelResponse (one model) are one struct here.
            known = SPEC_FIELDS[name] | (SPEC_FIELDS["ModelResponse"] if name == "Model" else frozenset())
            for field, sub in schema.get("properties", {}).items():
                if field not in known:
                    sub[EXT] = True
        elif name not in SPEC_NAMES_EARLIER:
            schema[EXT] = True


def _body(op: Op, ref: str) -> dict[str, Any]:
    if op.path == "/v1/audio/transcriptions":
        form = {
            "allOf": [{"$ref": ref}, {"type": "object", "properties": {"file": {"type": "string", "format": "binary"}}}]
        }
        return {"required": True, "content": {"multipart/form-data": {"schema": form}}}
    return {"required": True, "content": {JSON: {"schema": {"$ref": ref}}}}


def _operation(op: Op, refs: dict[Any, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"summary": op.summary, "tags": [op.tag]}
    if op.operation_id:
        out["operationId"] = op.operation_id
    else:
        out["operationId"] = re.sub(r"[^A-Za-z0-9]+", "_", f"{op.method}_{op.path}").strip("_")
        out[EXT] = True
    params = re.findall(r"{([a-z_]+)}", op.path)
    if params:
        out["parameters"] = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in params]
    if op.path == "/v1/usage":
        out["parameters"] = [{"name": "since", "in": "query", "schema": {"type": "string", "format": "date"}},
                             {"name": "model", "in": "query", "schema": {"type": "string"}}]  # fmt: skip
    if op.request is not None:
        out["requestBody"] = _body(op, refs[op.request])
    ok: dict[str, Any] = {"description": "OK"}
    if op.response_media == JSON and op.response is not None:
        ok["content"] = {JSON: {"schema": {"$ref": refs[op.response]}}}
    elif op.response_media == EVENT_STREAM and op.response is not None:
        # Each event's `data:` is one of these, told apart by its `type`.
        each = {"oneOf": [{"$ref": refs[op.response]}, {"$ref": refs[events.Dropped]}]}
        ok["content"] = {EVENT_STREAM: {"schema": each}}
        ok["description"] = "Server-Sent Events; each event's data is one of these as JSON"
    elif op.response_media != JSON:
        schema = (
            {"type": "string", "format": "binary"} if op.response_media.startswith("audio/") else {"type": "string"}
        )
        ok["content"] = {op.response_media: {"schema": schema}}
    if op.ndjson:
        ok["description"] = "OK; unless `stream: false`, newline-delimited JSON: one of these per line, the last `done`"
        ok.setdefault("content", {})[NDJSON] = {"schema": {"$ref": refs[op.response]}}
    if op.streams:
        ok["description"] = "OK; with `stream: true`, Server-Sent Events of chunks"
        ok.setdefault("content", {})["text/event-stream"] = {"schema": {"type": "string"}}
    error = {
        "description": "the error, its class in the status",
        "content": {JSON: {"schema": {"$ref": REF + "ErrorResponse"}}},
    }
    out["responses"] = {"200": ok, "400": error, "401": error, "404": error, "500": error, "503": error}
    if op.path.startswith("/v1/messages"):
        anthropic_error = {
            "description": "Anthropic's error shape",
            "content": {JSON: {"schema": {"$ref": REF + "AnthropicErrorResponse"}}},
        }
        out["responses"].update(dict.fromkeys(("400", "401", "404", "500", "529"), anthropic_error))
        del out["responses"]["503"]
    return out


@functools.cache
def document(version: str = "0.1.0") -> bytes:
    """The whole document, encoded once (it depends only on the code)."""
    ops = _ops()
    types = [t for op in ops for t in (op.request, op.response) if t is not None and not isinstance(t, str)]
    types += [ErrorResponse, anthropic.ErrorResponse, tok.Piece, events.Dropped]
    unique = list(dict.fromkeys(types))
    refs_raw, components = msgspec.json.schema_components(unique, ref_template=REF + "{name}")
    names = {n: RENAME.get(n, _dotted(n) if "." in n else n) for n in components}
    schemas = {names[n]: _rewrite_refs(s, names) for n, s in components.items()}
    for name, schema in schemas.items():
        if "title" in schema:  # msgspec's title is the struct's name; Swagger UI shows it
            schema["title"] = name
    schemas.update(copy.deepcopy(HAND_WRITTEN))
    # tool_choice: the spec's object, or one of the strings.
    schemas["ChatCompletionRequest"]["properties"]["tool_choice"] = {
        "anyOf": [{"type": "string", "enum": ["auto", "none", "required"]}, {"$ref": REF + "ChatCompletionToolChoice"},
                  {"type": "null"}], "default": None,
    }  # fmt: skip
    _mark_extensions(schemas)
    refs: dict[Any, str] = {t: _rewrite_refs(r, names)["$ref"] for t, r in zip(unique, refs_raw)}
    refs.update({name: REF + name for name in HAND_WRITTEN})
    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        paths.setdefault(op.path, {})[op.method] = _operation(op, refs)
    doc = {
        "openapi": "3.1.0",
        "info": {
            "title": "GenieX Server",
            "version": version,
            "description": "GenieX Server - OpenAI compatible API endpoints. Operations, schemas and fields marked "
            f'`{EXT}: true` (operations also tagged "GenieX extensions") are this server\'s additions to the '
            "GenieX API spec.",
        },
        "servers": [{"url": "/"}],
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
        "security": [{}, {"bearer": []}, {"apiKey": []}],
        "paths": paths,
    }
    return msgspec.json.encode(doc)


@get("/openapi.json", include_in_schema=False)
async def openapi_json() -> Response[bytes]:
    return Response(document(), media_type=JSON)


handlers = [openapi_json]
