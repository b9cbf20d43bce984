"""The `upstream` engine's translation, both ways, between our wire messages and the OpenAI
protocol an upstream server speaks. Pure functions and one small per-request state machine: no
I/O, so it is tested on its own.

Why the engine rebuilds an OpenAI request from the Generate (rather than the wire carrying the
client's body): the Generate is the one plan every dialect builds (chat completions, Anthropic
Messages, OpenAI Responses, text completions), already checked and normalised by the gateway;
forwarding it keeps one decode path, and the client's own body, headers and key never leave the
gateway. What the plan cannot say in OpenAI terms is refused with a clear message (a GBNF grammar).

Replies come back as our own messages: text as Deltas, reasoning as `<think>` text and tool calls
as Hermes `<tool_call>` text (the worker reports tool_format "hermes"), so that the gateway's one
shaper turns them into each dialect's reasoning and tool-call fields as it does for a local model.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec

from protocol.wire import (
    Delta,
    Done,
    Embed,
    ErrorKind,
    FromWorker,
    Generate,
    LogprobDelta,
    Rerank,
    Sampling,
    TokenLogprob,
)

ANY_OBJECT = {"type": "object"}
MAX_ERROR_CHARS = 600  # of an upstream's error message passed on to our client
_DEFAULTS = Sampling()


class UpstreamFailure(Exception):
    """The upstream failed a request: `kind` says how the gateway should answer."""

    def __init__(self, kind: ErrorKind, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.code = code


# ---------------------------------------------------------------- requests


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """A plan's message as OpenAI wants it: tool-call arguments back to JSON text (templates
    wanted them as objects)."""
    calls = m.get("tool_calls")
    if not calls:
        return m
    out = dict(m)
    out["tool_calls"] = [
        {**c, "function": {**c["function"], "arguments": a if isinstance(a := c["function"].get("arguments"), str)
                           else json.dumps(a)}}
        for c in calls
    ]  # fmt: skip
    return out


def _tool_choice(schema_text: str) -> Any:
    """The plan forces a tool call with a schema (gateway/chat/constraints.py forced_tool_schema):
    one function named by a `const` means that function, else any."""
    try:
        schema = json.loads(schema_text)
        name = schema["properties"]["name"]["const"]
    except (ValueError, KeyError, TypeError):
        return "required"
    return {"type": "function", "function": {"name": name}} if isinstance(name, str) else "required"


def _constraint(g: Generate, body: dict[str, Any]) -> None:
    c = g.constraint
    if c is None:
        return
    if c.kind == "gbnf":
        raise UpstreamFailure(ErrorKind.BAD_REQUEST, f"`{c.field or 'grammar'}`: a GBNF grammar is not forwarded to "
                              "an upstream model; ask for `response_format` with a JSON schema instead")  # fmt: skip
    if c.field == "tools":
        body["tool_choice"] = _tool_choice(c.text)
        return
    schema = json.loads(c.text)
    if schema == ANY_OBJECT:
        body["response_format"] = {"type": "json_object"}
    else:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def generate_request(g: Generate, model: str) -> tuple[str, dict[str, Any]]:
    """(path below the base URL, JSON body) of the streamed request that answers `g`."""
    body: dict[str, Any] = {"model": model}
    if g.messages is not None:
        path = "chat/completions"
        body["messages"] = [_message(m) for m in g.messages]
        if g.tools:
            body["tools"] = g.tools
        if g.template_vars.get("enable_thinking") is False:
            body["chat_template_kwargs"] = {"enable_thinking": False}
        if g.reasoning_budget >= 0:  # llama-server's name; vLLM and the like ignore what they do not read
            body["thinking_budget_tokens"] = g.reasoning_budget
    else:
        path = "completions"
        body["prompt"] = g.prompt or ""
        if g.suffix is not None:
            body["suffix"] = g.suffix
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if g.max_tokens is not None:
        body["max_tokens"] = g.max_tokens
    if g.stop:
        body["stop"] = g.stop
    s = g.sampling
    body["temperature"] = s.temperature
    body["top_p"] = s.top_p
    # Extensions vLLM, SGLang and llama-server read: sent only when the client changed them, so that
    # an upstream's own defaults hold otherwise (and a strict server is not sent what it refuses).
    for name, value, default in (("top_k", s.top_k, _DEFAULTS.top_k), ("min_p", s.min_p, _DEFAULTS.min_p),
                                 ("repetition_penalty", s.repeat_penalty, _DEFAULTS.repeat_penalty)):  # fmt: skip
        if value != default:
            body[name] = value
    if s.presence_penalty:
        body["presence_penalty"] = s.presence_penalty
    if s.frequency_penalty:
        body["frequency_penalty"] = s.frequency_penalty
    if s.seed is not None:
        body["seed"] = s.seed
    if g.logit_bias:
        body["logit_bias"] = {str(t): b for t, b in g.logit_bias}
    if g.logprobs >= 0:
        if g.messages is not None:
            body["logprobs"] = True
            body["top_logprobs"] = g.logprobs
        else:
            body["logprobs"] = g.logprobs
    _constraint(g, body)
    return path, body


def embed_request(e: Embed, model: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "input": e.texts if e.texts is not None else e.token_ids,
                            "encoding_format": "base64"}  # fmt: skip
    if e.dimensions:
        body["dimensions"] = e.dimensions
    return body


def rerank_request(r: Rerank, model: str) -> dict[str, Any]:
    return {"model": model, "query": r.query, "documents": r.documents}


# ---------------------------------------------------------------- replies


class _Fn(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolDelta(msgspec.Struct):
    index: int = 0
    function: _Fn | None = None


class _ChunkDelta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # vLLM's newer spelling
    tool_calls: list[_ToolDelta] | None = None


class _ChunkChoice(msgspec.Struct):
    index: int = 0
    delta: _ChunkDelta | None = None
    text: str | None = None  # text completions
    finish_reason: str | None = None
    logprobs: Any = None


class _Details(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int | None = None
    prompt_tokens_details: _Details | None = None


class _Chunk(msgspec.Struct):
    choices: list[_ChunkChoice] = []
    usage: _Usage | None = None
    error: Any = None


_chunk_decoder = msgspec.json.Decoder(_Chunk)


def error_text(body: bytes) -> str:
    """The message in an upstream's error body: OpenAI's {"error": {"message"}}, GenieX's
    {"error": "..."}, vLLM's {"message"} or FastAPI's {"detail"}; else the body's text, cut short."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    text: Any = None
    if isinstance(data, dict):
        err = data.get("error")
        text = err.get("message") if isinstance(err, dict) else err
        text = text or data.get("message") or data.get("detail")
    if not isinstance(text, str):
        text = body.decode("utf-8", "replace").strip() if text is None else json.dumps(text)
    return text[:MAX_ERROR_CHARS] or "(no message)"


def _token_bytes(entry: dict[str, Any]) -> bytes:
    raw = entry.get("bytes")
    if isinstance(raw, list) and all(isinstance(b, int) and 0 <= b < 256 for b in raw):
        return bytes(raw)
    return str(entry.get("token", "")).encode()


def _logprobs(lp: Any) -> list[TokenLogprob]:
    """Chat's logprobs.content entries, or a text completion's parallel lists, as ours."""
    if not isinstance(lp, dict):
        return []
    out: list[TokenLogprob] = []
    content = lp.get("content")
    if isinstance(content, list):
        for e in content:
            if isinstance(e, dict):
                top = [(_token_bytes(t), float(t.get("logprob", 0.0))) for t in e.get("top_logprobs") or []
                       if isinstance(t, dict)]  # fmt: skip
                out.append(TokenLogprob(_token_bytes(e), float(e.get("logprob", 0.0)), top))
        return out
    tokens, values, tops = lp.get("tokens") or [], lp.get("token_logprobs") or [], lp.get("top_logprobs") or []
    for i, tok in enumerate(tokens):
        top_i = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        value = values[i] if i < len(values) and isinstance(values[i], int | float) else 0.0
        out.append(
            TokenLogprob(str(tok).encode(), float(value), [(str(k).encode(), float(v)) for k, v in top_i.items()])
        )
    return out


class StreamReader:
    """One upstream SSE stream, read into our messages for request `req_id`."""

    def __init__(self, req_id: int, where: str) -> None:
        self.req_id = req_id
        self.where = where
        self.n = 0  # text pieces relayed: the token count until the upstream's usage says better
        self.thinking = False
        self.calls: dict[int, list[str]] = {}  # tool call index -> [name, arguments so far]
        self.finish: str | None = None
        self.usage: _Usage | None = None
        self.ended = False  # [DONE] seen

    def feed(self, payload: bytes) -> list[FromWorker]:
        """One `data:` payload; raises UpstreamFailure for an error event."""
        if payload.strip() == b"[DONE]":
            self.ended = True
            return []
        try:
            chunk = _chunk_decoder.decode(payload)
        except msgspec.DecodeError as exc:
            raise UpstreamFailure(ErrorKind.UPSTREAM, f"{self.where} sent an unreadable event: {exc}") from None
        if chunk.error is not None:
            raise UpstreamFailure(ErrorKind.UPSTREAM, f"{self.where} failed mid-answer: "
                                  f"{error_text(json.dumps({'error': chunk.error}).encode())}")  # fmt: skip
        if chunk.usage is not None:
            self.usage = chunk.usage
        out: list[FromWorker] = []
        for choice in chunk.choices:
            text = self._text(choice)
            lps = _logprobs(choice.logprobs) if choice.logprobs is not None else []
            if text or lps:
                self.n += max(1, len(lps))
                out.append(LogprobDelta(self.req_id, text, self.n, lps) if lps else Delta(self.req_id, text, self.n))
            if choice.finish_reason is not None:
                self.finish = choice.finish_reason
        return out

    def _text(self, choice: _ChunkChoice) -> str:
        if choice.text is not None:
            return choice.text
        d = choice.delta
        if d is None:
            return ""
        parts: list[str] = []
        reasoning = d.reasoning_content or d.reasoning
        if reasoning:
            if not self.thinking:
                parts.append("<think>")
                self.thinking = True
            parts.append(reasoning)
        if d.content:
            if self.thinking:
                parts.append("</think>")
                self.thinking = False
            parts.append(d.content)
        for t in d.tool_calls or ():
            call = self.calls.setdefault(t.index, ["", ""])
            if t.function is not None:
                call[0] += t.function.name or ""
                call[1] += t.function.arguments or ""
        return "".join(parts)

    def complete(self) -> bool:
        return self.ended or self.finish is not None

    def close(self) -> list[FromWorker]:
        """The messages that end the answer: the tool calls as text, then Done with the upstream's counts."""
        tail: list[str] = []
        if self.thinking:
            tail.append("</think>")
        for _, (name, arguments) in sorted(self.calls.items()):
            try:
                args: Any = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                args = arguments
            tail.append(f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>")
        out: list[FromWorker] = []
        if tail:
            self.n += 1
            out.append(Delta(self.req_id, "".join(tail), self.n))
        u = self.usage
        completion = u.completion_tokens if u is not None and u.completion_tokens is not None else self.n
        cached = (u.prompt_tokens_details.cached_tokens or 0) if u is not None and u.prompt_tokens_details else 0
        out.append(Done(self.req_id, "length" if self.finish == "length" else "stop",
                        prompt_tokens=u.prompt_tokens if u is not None else 0, completion_tokens=completion,
                        cached_tokens=cached))  # fmt: skip
        return out


def embeddings_of(body: Any, n_inputs: int, where: str) -> tuple[int, bytes, int]:
    """(dim, little-endian float32 rows in input order, prompt tokens) of an embeddings answer."""
    import numpy as np  # the worker has numpy (a base dependency); only embeddings need it

    try:
        rows = sorted(body["data"], key=lambda d: d["index"])
        vectors = [np.frombuffer(base64.b64decode(r["embedding"]), dtype="<f4") if isinstance(r["embedding"], str)
                   else np.asarray(r["embedding"], dtype="<f4") for r in rows]  # fmt: skip
        usage = body.get("usage") or {}
        tokens = int(usage.get("prompt_tokens") or usage.get("total_tokens") or 0)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UpstreamFailure(ErrorKind.UPSTREAM, f"{where} sent an unreadable embeddings answer ({exc!r})") from None
    if len(vectors) != n_inputs or len({v.shape for v in vectors}) > 1:
        raise UpstreamFailure(ErrorKind.UPSTREAM, f"{where} answered {len(vectors)} vectors for {n_inputs} inputs")
    data = np.stack(vectors).astype("<f4") if vectors else np.zeros((0, 0), dtype="<f4")
    return (int(data.shape[1]) if vectors else 0), data.tobytes(), tokens


def scores_of(body: Any, n_docs: int, where: str) -> tuple[list[float], int]:
    """Scores in document order from vLLM/Jina/Cohere's {"results": [{index, relevance_score}]} or
    GenieX's {"result": [...]}, and the prompt tokens when the upstream says."""
    try:
        if isinstance(body.get("result"), list):
            scores = [float(s) for s in body["result"]]
        else:
            scores = [0.0] * n_docs
            seen = 0
            for r in body["results"]:
                scores[int(r["index"])] = float(r["relevance_score"])
                seen += 1
            if seen != n_docs:
                raise ValueError(f"{seen} results")
        usage = body.get("usage") or {}
        tokens = int(usage.get("prompt_tokens") or usage.get("total_tokens") or 0)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise UpstreamFailure(ErrorKind.UPSTREAM, f"{where} sent an unreadable rerank answer ({exc!r})") from None
    if len(scores) != n_docs:
        raise UpstreamFailure(ErrorKind.UPSTREAM, f"{where} answered {len(scores)} scores for {n_docs} documents")
    return scores, tokens


def refusal(status: int, body: bytes, where: str) -> UpstreamFailure:
    """How the gateway answers an upstream's error status. A client's mistake (400, 413, 422)
    is passed through as a 400 with the upstream's message; 429 is our 503 (retry later); a
    refusal of OUR credential or model name (401, 403, 404) is the operator's to fix, so our
    client gets a 502 and never a 401 that would read as its own key being wrong."""
    text = error_text(body)
    if status in (400, 413, 422):
        return UpstreamFailure(ErrorKind.BAD_REQUEST, f"{where} refused the request ({status}): {text}")
    if status == 429:
        return UpstreamFailure(ErrorKind.OVERLOADED, f"{where} is at capacity (429): {text}")
    if status in (401, 403):
        return UpstreamFailure(ErrorKind.UPSTREAM, f"{where} refused GenieX's credential ({status}); "
                               "check the key the manifest names")  # fmt: skip
    if 400 <= status < 500 and status != 404:
        return UpstreamFailure(ErrorKind.BAD_REQUEST, f"{where} refused the request ({status}): {text}")
    return UpstreamFailure(ErrorKind.UPSTREAM, f"{where} answered {status}: {text}")
