"""/v1/models as clients choose from it, and the explicit lifecycle: POST /v1/models/load and /unload."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import openai

from tests.conftest import MODEL
from tests.server_proc import ServerProcess


def post(srv: ServerProcess, path: str, body: dict) -> httpx.Response:  # type: ignore[type-arg]
    return httpx.post(f"{srv.base_url}{path}", json=body, timeout=120)


def models(srv: ServerProcess) -> dict[str, dict]:  # type: ignore[type-arg]
    return {m["id"]: m for m in httpx.get(f"{srv.base_url}/v1/models", timeout=10).json()["data"]}


def test_every_model_says_what_it_is_and_whether_it_is_loaded(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    listed = {m.id: m for m in client.models.list().data}
    m = listed[MODEL]
    assert m.object == "model" and m.owned_by == "HuggingFaceTB"
    # What an editor's model picker reads, through the SDK's model too (its extra fields).
    assert (m.tools, m.vision, m.reasoning, m.embeddings, m.audio) == (True, False, False, False, False)  # type: ignore[attr-defined]
    assert m.served_context == 2048 and m.compute == "cpu"  # type: ignore[attr-defined]  # the server's --nctx 2048 < 8192
    assert m.aliases == [] and m.defaults == {}  # type: ignore[attr-defined]  # no models file
    one = httpx.get(f"{server.base_url}/v1/models/{MODEL}", timeout=10).json()
    assert one["object"] == "model" and one["capabilities"] == ["chat", "completion", "tools", "logits"]
    assert one["context_length"] == 8192 and one["quantization"] == "Q4_1" and one["engine"] == "llama_cpp"
    assert one["size"] > 50_000_000
    post(server, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                          "max_tokens": 1})  # fmt: skip
    loaded = models(server)[MODEL]["loaded"]  # the shared server: other tests' workers may be there too
    assert ("cpu", 2048) in [(r["compute"], r["nctx"]) for r in loaded] and all(r["pid"] > 0 for r in loaded)


def test_load_and_unload_are_explicit_idempotent_and_never_cut_an_answer(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "512", "--keep-alive-s", "300")
    assert models(srv)[MODEL]["loaded"] == [] and models(srv)[MODEL]["state"] == "not_loaded"
    assert models(srv)[MODEL]["served_context"] == 512
    r = post(srv, "/v1/models/load", {"model": MODEL, "nctx": 1024, "compute": "CPU", "keep_alive": -1})
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "ready"
    assert [(x["nctx"], x["state"], x["keep_alive"]) for x in r.json()["loaded"]] == [(1024, "idle", -1.0)]
    pid = r.json()["loaded"][0]["pid"]
    again = post(srv, "/v1/models/load", {"model": MODEL, "nctx": 1024})
    assert [x["pid"] for x in again.json()["loaded"]] == [pid], "loading a loaded model starts nothing"
    workers = httpx.get(f"{srv.base_url}/v1/workers", timeout=10).json()["data"]
    assert [(w["pid"], w["keep_alive_s"]) for w in workers] == [(pid, -1.0)]

    # Busy: refused with 409 and Retry-After, and the answer in flight completes.
    client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell a long story."}],
        max_tokens=64,
        stream=True,
        extra_body={"nctx": 1024},
    )
    it = iter(stream)
    next(it)
    busy = post(srv, "/v1/models/unload", {"model": MODEL})
    assert busy.status_code == 409 and "Retry-After" in busy.headers and "serving" in busy.json()["error"]
    rest = list(it)
    assert rest[-1].choices[0].finish_reason in ("length", "stop")

    done = post(srv, "/v1/models/unload", {"model": MODEL, "nctx": 1024, "compute": "cpu"})
    assert done.status_code == 200 and [x["pid"] for x in done.json()["unloaded"]] == [pid], done.text
    assert (
        models(srv)[MODEL]["loaded"] == [] and httpx.get(f"{srv.base_url}/v1/workers", timeout=10).json()["data"] == []
    )
    assert models(srv)[MODEL]["state"] == "not_loaded"
    assert post(srv, "/v1/models/unload", {"model": MODEL}).json()["unloaded"] == []
    metrics = httpx.get(f"{srv.base_url}/metrics", timeout=10).text
    assert f'geniex:worker_unloads_total{{model="{MODEL}"}} 1.0' in metrics

    assert post(srv, "/v1/models/load", {"model": "nobody/nothing"}).status_code == 404
    assert post(srv, "/v1/models/load", {"model": MODEL, "nctx": 100_000}).status_code == 400
    assert post(srv, "/v1/models/unload", {}).status_code == 400


def test_nctx_zero_is_the_server_default_and_compute_is_any_case(server: ServerProcess) -> None:
    """The spec's own example sends `nctx: 0`."""
    hi = [{"role": "user", "content": "hi"}]
    post(server, "/v1/chat/completions", {"model": MODEL, "messages": hi, "max_tokens": 1})
    before = {(w["nctx"], w["pid"]) for w in httpx.get(f"{server.base_url}/v1/workers", timeout=10).json()["data"]}
    r = post(server, "/v1/chat/completions", {"model": MODEL, "messages": hi, "max_tokens": 1, "nctx": 0,
                                              "compute": "CPU"})  # fmt: skip
    assert r.status_code == 200, r.text
    r = post(server, "/v1/logits", {"model": MODEL, "input_ids": [1, 2], "nctx": 0, "compute": "Cpu"})
    assert r.status_code == 200, r.text
    after = {(w["nctx"], w["pid"]) for w in httpx.get(f"{server.base_url}/v1/workers", timeout=10).json()["data"]}
    assert after == before and 2048 in {n for n, _ in after}, "nctx 0 went to the default (2048) worker"
    bad = post(server, "/v1/chat/completions", {"model": MODEL, "messages": hi, "compute": "tpu"})
    assert bad.status_code == 400 and "`compute`" in bad.json()["error"]


def test_text_routes_refuse_a_model_of_another_kind_before_loading_it(server: ServerProcess) -> None:
    """The bundled Whisper model (the audio extra) asked to chat, complete, count or give logits: a
    400 that names what it is and which models can, and no worker is started for it."""
    from gateway.models.store import WHISPER_MODEL_ID

    say = [{"role": "user", "content": "hi"}]
    asks = {
        "/v1/chat/completions": ({"messages": say, "max_tokens": 1}, "chat"),
        "/v1/messages": ({"messages": say, "max_tokens": 1}, "chat"),
        "/v1/responses": ({"input": "hi", "max_output_tokens": 16}, "chat"),
        "/v1/completions": ({"prompt": "hi", "max_tokens": 1}, "completion"),
        "/v1/logits": ({"input_ids": [1]}, "logits"),
    }

    def resident() -> list[int]:
        return [
            w["pid"] for w in httpx.get(f"{server.base_url}/v1/models/{WHISPER_MODEL_ID}", timeout=10).json()["loaded"]
        ]

    before = resident()  # another test of the session may have loaded it for speech to text
    for path, (body, capability) in asks.items():
        r = post(server, path, {"model": WHISPER_MODEL_ID, **body})
        assert r.status_code == 400, (path, r.text)
        assert f"does not support {capability}; models that do: {MODEL}" in r.text, (path, r.text)
    assert resident() == before


class EventReader:
    """A client of GET /v1/events in a thread: its status, then every event's JSON, as they come."""

    def __init__(self, srv: ServerProcess, headers: dict[str, str] | None = None) -> None:
        self.status = 0
        self.events: list[dict[str, Any]] = []
        self.comments = 0
        self.ended = threading.Event()
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(srv.base_url, headers or {}), daemon=True)
        self._thread.start()
        assert self._connected.wait(30), "no answer from /v1/events"

    def _read(self, base_url: str, headers: dict[str, str]) -> None:
        try:
            with httpx.stream("GET", f"{base_url}/v1/events", headers=headers, timeout=httpx.Timeout(10, read=60)) as r:
                self.status = r.status_code
                self.content_type = r.headers.get("content-type", "")
                self._connected.set()
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        self.events.append(json.loads(line[5:]))
                    elif line.startswith(":"):
                        self.comments += 1
        except httpx.HTTPError:
            pass
        finally:
            self._connected.set()
            self.ended.set()

    def wait_for(self, state: str, timeout: float = 60) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(e.get("state") == state for e in self.events):
                return list(self.events)
            time.sleep(0.05)
        raise AssertionError(f"no {state!r} event within {timeout} s: {self.events}")


def test_the_event_stream_follows_a_load_and_an_unload_in_order(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "512")
    first = EventReader(srv)
    assert first.status == 200 and first.content_type.startswith("text/event-stream")
    r = post(srv, "/v1/models/load", {"model": MODEL})
    assert r.status_code == 200, r.text
    pid = r.json()["loaded"][0]["pid"]
    first.wait_for("ready")
    # A client that connects now is told what is there first: the worker, idle.
    second = EventReader(srv)
    snapshot = second.wait_for("idle", timeout=10)
    assert [(e["model"], e["state"], e["pid"], e["snapshot"]) for e in snapshot] == [(MODEL, "idle", pid, True)]
    assert post(srv, "/v1/models/unload", {"model": MODEL}).status_code == 200
    seen = first.wait_for("unloaded")
    assert [e["state"] for e in seen] == ["loading", "ready", "stopping", "unloaded"], seen
    assert {(e["type"], e["model"], e["pid"], e["compute"], e["nctx"]) for e in seen} == {
        ("worker", MODEL, pid, "cpu", 512)
    }
    assert seen[-1]["reason"] == "unload" and seen[0]["at"] <= seen[-1]["at"] <= time.time() + 1
    assert second.wait_for("unloaded")[-1]["pid"] == pid
    # A request: busy, then idle.
    post(srv, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                       "max_tokens": 1})  # fmt: skip
    states = [e["state"] for e in first.wait_for("idle")]
    assert states[4:] == ["loading", "ready", "busy", "idle"], states
    # The server's drain ends the streams, so that it stops at once.
    t0 = time.monotonic()
    srv.stop()
    assert first.ended.wait(10) and second.ended.wait(10) and time.monotonic() - t0 < 20


def test_with_keys_the_event_stream_needs_one(start) -> None:  # type: ignore[no-untyped-def]
    key = "sk-alice-0123456789abcdef"
    srv = start("--nctx", "512", "--api-key", key)
    refused = httpx.get(f"{srv.base_url}/v1/events", timeout=10)
    assert refused.status_code == 401 and "API key" in refused.json()["error"]
    keyed = EventReader(srv, {"authorization": f"Bearer {key}"})
    assert keyed.status == 200
