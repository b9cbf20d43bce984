"""Pulling a model over HTTP: `POST /v1/models/pull` (ours, SSE) and `POST /api/pull` (Ollama's, NDJSON).

Both take a Hugging Face GGUF repository (`org/repo[:precision]`, or Ollama's `hf.co/org/repo:QUANT`;
gateway/models/pull_names.py) and follow the server's one download of it (gateway/models/pulls.py):
clients pulling the same model share it, and when every one of them has disconnected it is cancelled
and nothing of it is left in the store. With API keys, only a key that manages models may pull (403).

`/v1/models/pull` `{"model", "stream": true}`: Server-Sent Events `progress` (`{"status", "digest",
"total", "completed", "file"}`), then `done` (the model as `/v1/models/{id}` shows it) or `error`
(`{"error"}`). With `"stream": false`, the model as JSON once it is pulled, or the error's status:
400 a name that is not a Hugging Face repository, 404 no such repository (or no GGUF / no such
precision in it), 502 the hub failed or cannot be reached (or the file arrived damaged), 507 the
data dir's disk cannot hold it, 503 the server shut down meanwhile.

`/api/pull` `{"model" (or "name"), "insecure", "stream": true}`: one JSON object a line, as Ollama
writes them: `{"status": "pulling manifest"}`, per file `{"status": "pulling <12 hex>", "digest",
"total", "completed"}`, `{"status": "verifying sha256 digest"}`, `{"status": "writing manifest"}`,
`{"status": "success"}`; a failure mid-stream is a last line `{"error": "..."}` (what Ollama's
clients raise from). With `"stream": false`, `{"status": "success"}` or the error with its status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import RawBody
from litestar.response import ServerSentEvent, ServerSentEventMessage, Stream
from litestar.types import ControllerRouterHandler

from gateway.errors import GenieXError
from gateway.http.auth import require_manage
from gateway.http.body import read_json
from gateway.http.disconnect import unless_disconnected
from gateway.http.encoding import encode
from gateway.http.model_facts import facts_of
from gateway.http.model_view import model_view  # the entry exactly as /v1/models/{id} shows it
from gateway.http.services import Services
from gateway.models.pull_names import pull_name
from gateway.models.store import ModelEntry
from protocol.pull import OllamaPullRequest, PullError, PullRequest, PullStatus, status_of

NDJSON = "application/x-ndjson"
WHAT = "pull models"


async def _pulled(request: Request, services: Services, name: str) -> ModelEntry:
    """Follow the download of `name` to its end (a client that leaves stops following it)."""
    follower = services.pulls.follow(services.store, name)
    try:
        return await unless_disconnected(request, follower.wait())
    finally:
        follower.leave()  # also when the wait was cancelled before it began


@post("/v1/models/pull", status_code=200)
async def pull_model(request: Request, body: RawBody,
                     services: NamedDependency[Services]) -> Response[bytes] | ServerSentEvent:  # fmt: skip
    require_manage(request, WHAT)
    data = read_json(body, PullRequest)
    name = pull_name(data.model)
    if not data.stream:
        entry = await _pulled(request, services, name)
        return Response(encode(model_view(entry, services, facts_of(services))), media_type="application/json")
    return ServerSentEvent(_sse(services, name))


async def _sse(services: Services, name: str) -> AsyncIterator[ServerSentEventMessage]:
    # Joined here, not in the handler: a stream that never starts never holds a download.
    follower = services.pulls.follow(services.store, name)
    try:
        async for step in follower.progress():
            if step is None:
                yield ServerSentEventMessage(comment="keep-alive", data=None)
            elif step.phase != "success":  # `done` says it, with the model
                yield ServerSentEventMessage(event="progress", data=encode(status_of(step, with_file=True)).decode())
        try:
            entry = follower.result()
        except GenieXError as exc:
            yield ServerSentEventMessage(event="error", data=encode(PullError(exc.message)).decode())
            return
        model = model_view(entry, services, facts_of(services))
        yield ServerSentEventMessage(event="done", data=encode(model).decode())
    finally:
        follower.leave()


@post("/api/pull", status_code=200)
async def ollama_pull(request: Request, body: RawBody, services: NamedDependency[Services]) -> Response[bytes] | Stream:
    require_manage(request, WHAT)
    data = read_json(body, OllamaPullRequest)
    name = pull_name(data.which)
    if not data.stream:
        await _pulled(request, services, name)
        return Response(encode(PullStatus("success")), media_type="application/json")
    return Stream(_ndjson(services, name), media_type=NDJSON)


async def _ndjson(services: Services, name: str) -> AsyncIterator[bytes]:
    follower = services.pulls.follow(services.store, name)
    last = PullStatus("pulling manifest")
    try:
        async for step in follower.progress():
            # A line repeated is Ollama's keep-alive: its clients read every line as JSON, so no blank ones.
            last = last if step is None else status_of(step)
            yield encode(last) + b"\n"
        try:
            follower.result()
        except GenieXError as exc:
            yield encode(PullError(exc.message)) + b"\n"
    finally:
        follower.leave()


handlers: list[ControllerRouterHandler] = [pull_model, ollama_pull]
