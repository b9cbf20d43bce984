"""Pulling over HTTP against the real server and the hub double (tests/hub_double.py):
`POST /api/pull` with the official `ollama` client, `POST /v1/models/pull` as SSE and as JSON,
a client that disconnects (the download stops, nothing is left), two clients sharing one download,
the hub's failures as error events, hostile names, and who may pull when the server has keys."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from tests.hub_double import HubDouble
from tests.server_proc import ServerProcess, serving

MIB = 1 << 20
FLAG_KEY, ADMIN_KEY, USER_KEY = "sk-flag-0123456789", "sk-admin-0123456789", "sk-user-0123456789"


def gguf(size: int) -> bytes:
    return b"GGUF" + os.urandom(size - 4)


def hub_repos() -> dict[str, dict[str, bytes]]:
    return {
        "acme/Vision-GGUF": {"Vision-Q4_0.gguf": gguf(3 * MIB), "mmproj-Vision-F16.gguf": gguf(200_000)},
        "acme/Tiny-GGUF": {"Tiny-Q4_0.gguf": gguf(2 * MIB + 5), "Tiny-Q8_0.gguf": gguf(300_000)},
        "acme/Slow-GGUF": {"Slow-Q4_0.gguf": gguf(8 * MIB)},
        "acme/Shared-GGUF": {"Shared-Q4_0.gguf": gguf(4 * MIB)},
        "acme/Broken-GGUF": {"Broken-Q4_0.gguf": gguf(2 * MIB)},
        "acme/safetensors-only": {"model.safetensors": b"\0" * 100},
        "acme/Keyed-GGUF": {"Keyed-Q4_0.gguf": gguf(100_000), "Keyed-Q8_0.gguf": gguf(150_000)},
    }


@pytest.fixture(scope="module")
def hub() -> Iterator[HubDouble]:
    with HubDouble(hub_repos()) as double:
        double.throttle("acme/Vision-GGUF", "Vision-Q4_0.gguf", chunk=256 << 10, delay=0.03)
        double.throttle("acme/Tiny-GGUF", "Tiny-Q4_0.gguf", chunk=256 << 10, delay=0.03)
        double.throttle("acme/Shared-GGUF", "Shared-Q4_0.gguf", chunk=128 << 10, delay=0.03)
        double.break_download("acme/Broken-GGUF", "Broken-Q4_0.gguf", after=1_000_000, then="error")
        yield double


def hub_env(hub: HubDouble, base: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(base / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": ""}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pull-http")


@pytest.fixture(scope="module")
def server(hub: HubDouble, base: Path) -> Iterator[ServerProcess]:
    with serving(base / "data", env=hub_env(hub, base)) as srv:
        yield srv


@pytest.fixture(scope="module")
def keyed(hub: HubDouble, base: Path) -> Iterator[ServerProcess]:
    keys = base / "api-keys"
    keys.write_text(f"{ADMIN_KEY} admin manage=yes\n{USER_KEY} user rpm=100\n")
    with serving(base / "keyed", "--api-key", FLAG_KEY, "--api-key-file", str(keys), env=hub_env(hub, base)) as srv:
        yield srv


def listed(srv: ServerProcess, key: str | None = None) -> set[str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.get(srv.base_url + "/v1/models", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    return {m["id"] for m in r.json()["data"]}


def staged(srv: ServerProcess) -> list[Path]:
    partial = srv.data_dir / "models" / ".partial"
    return list(partial.iterdir()) if partial.is_dir() else []


def sse(response: httpx.Response) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event, data) of each event in a Server-Sent Events body."""
    event, data = "message", []
    for line in response.iter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and data:
            yield event, json.loads("\n".join(data))
            event, data = "message", []


def pull_sse(srv: ServerProcess, model: str, **headers: str) -> list[tuple[str, dict[str, Any]]]:
    with httpx.stream("POST", srv.base_url + "/v1/models/pull", json={"model": model}, headers=headers,
                      timeout=60) as r:  # fmt: skip
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return list(sse(r))


def grows_to_total(counts: list[tuple[int, int]]) -> bool:
    done = [c for c, _ in counts]
    return done == sorted(done) and done[-1] == counts[-1][1] and any(0 < c < t for c, t in counts)


# ---------------------------------------------------------------- Ollama's /api/pull


def test_the_ollama_client_pulls_with_progress_to_success(server: ServerProcess, hub: HubDouble) -> None:
    parts = list(ollama.Client(host=server.base_url).pull("hf.co/acme/Vision-GGUF:Q4_0", stream=True))
    statuses = [p.status for p in parts]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    files = hub.repos["acme/Vision-GGUF"]
    for name in ("Vision-Q4_0.gguf", "mmproj-Vision-F16.gguf"):  # the model and its projector, each a layer
        digest = "sha256:" + hashlib.sha256(files[name]).hexdigest()
        mine = [p for p in parts if p.digest == digest]
        assert mine and all(p.status == f"pulling {digest[7:19]}" and p.total == len(files[name]) for p in mine)
        assert [p.completed for p in mine][-1] == len(files[name])
    model = [(p.completed or 0, p.total or 0) for p in parts if p.digest and p.digest[7:19] in (statuses[1] or "")]
    assert grows_to_total(model), model
    assert "acme/Vision-GGUF:Q4_0" in listed(server)


def test_ollama_without_streaming_and_with_the_older_name_field(server: ServerProcess) -> None:
    r = httpx.post(server.base_url + "/api/pull", json={"name": "acme/Tiny-GGUF:Q8_0", "stream": False}, timeout=60)
    assert r.status_code == 200 and r.json() == {"status": "success"}
    assert "acme/Tiny-GGUF:Q8_0" in listed(server)
    with pytest.raises(ollama.ResponseError) as caught:
        ollama.Client(host=server.base_url).pull("acme/does-not-exist", stream=False)
    assert caught.value.status_code == 404 and "no model repository acme/does-not-exist" in caught.value.error


def test_a_failure_mid_stream_is_an_error_line_the_client_raises(server: ServerProcess) -> None:
    with pytest.raises(ollama.ResponseError, match="no GGUF files"):
        list(ollama.Client(host=server.base_url).pull("acme/safetensors-only", stream=True))


# ---------------------------------------------------------------- /v1/models/pull


def test_sse_pull_streams_progress_then_the_model(server: ServerProcess) -> None:
    events = pull_sse(server, "acme/Tiny-GGUF:latest")  # `latest`: the preferred precision
    kinds = [e for e, _ in events]
    assert kinds[-1] == "done" and set(kinds[:-1]) == {"progress"}
    progress = [d for e, d in events if e == "progress"]
    assert progress[0] == {"status": "pulling manifest"}
    assert [p["status"] for p in progress[-2:]] == ["verifying sha256 digest", "writing manifest"]
    counts = [(p["completed"], p["total"]) for p in progress if p.get("file") == "Tiny-Q4_0.gguf"]
    assert grows_to_total(counts), counts
    done = events[-1][1]
    assert done["id"] == "acme/Tiny-GGUF:Q4_0" and done["object"] == "model" and done["quantization"] == "Q4_0"
    assert "acme/Tiny-GGUF:Q4_0" in listed(server)
    # Pulled already: JSON at once, without a download.
    r = httpx.post(server.base_url + "/v1/models/pull", json={"model": "acme/Tiny-GGUF:q4_0", "stream": False})
    assert r.status_code == 200 and r.json()["id"] == "acme/Tiny-GGUF:Q4_0"


def test_a_client_that_disconnects_cancels_the_download(server: ServerProcess, hub: HubDouble) -> None:
    # The hub holds the body back after 1 MiB of 8 until the client has gone: mid-download on any machine.
    hold = hub.hold("acme/Slow-GGUF", "Slow-Q4_0.gguf", at=1 << 20)
    with httpx.stream("POST", server.base_url + "/v1/models/pull", json={"model": "acme/Slow-GGUF"}, timeout=30) as r:
        for event, data in sse(r):
            if event == "progress" and data.get("completed"):
                break
    assert staged(server), "the download was staged while it ran"
    left = time.monotonic()
    while "every client following the pull left" not in server.log():
        assert time.monotonic() - left < 15, "the server did not see the client go"
        time.sleep(0.05)
    hold.released.set()  # the download's next read sees the cancel
    while "pull cancelled; nothing of it was kept" not in server.log():
        assert time.monotonic() - left < 15, "the download did not stop"
        time.sleep(0.05)
    assert time.monotonic() - left < 5, "it stopped within a read of the download"
    assert not staged(server), "the cancelled download removed what it had staged"
    assert "acme/Slow-GGUF:Q4_0" not in listed(server)
    assert not (server.data_dir / "models" / "acme" / "Slow-GGUF").exists()
    assert len(hub.requested("GET", "Slow-Q4_0.gguf")) == 1


def test_two_clients_pulling_one_model_share_one_download(server: ServerProcess, hub: HubDouble) -> None:
    results: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    started = threading.Event()

    def first() -> None:
        got = []
        with httpx.stream("POST", server.base_url + "/v1/models/pull", json={"model": "acme/Shared-GGUF:Q4_0"},
                          timeout=60) as r:  # fmt: skip
            for event, data in sse(r):
                got.append((event, data))
                if data.get("completed"):
                    started.set()
        results["first"] = got

    thread = threading.Thread(target=first)
    thread.start()
    assert started.wait(30), "the first pull never made progress"
    results["second"] = pull_sse(server, "hf.co/acme/Shared-GGUF:q4_0")  # the same model, written otherwise
    thread.join(60)
    size = len(hub.repos["acme/Shared-GGUF"]["Shared-Q4_0.gguf"])
    for events in results.values():
        assert events[-1][0] == "done" and events[-1][1]["id"] == "acme/Shared-GGUF:Q4_0"
        assert events[0][1] == {"status": "pulling manifest"}
        assert [d["completed"] for _, d in events if d.get("file")][-1] == size
    assert len(hub.requested("GET", "Shared-Q4_0.gguf")) == 1, "one download served both clients"


def test_hub_failures_are_error_events_naming_the_cause(server: ServerProcess) -> None:
    events = pull_sse(server, "acme/nope-GGUF")
    assert events[-1] == (
        "error",
        {"error": "no model repository acme/nope-GGUF on Hugging Face (if it is private, set HF_TOKEN)"},
    )
    events = pull_sse(server, "acme/Broken-GGUF")  # the connection drops mid-file, then the hub answers 500
    event, data = events[-1]
    assert event == "error" and "download of acme/Broken-GGUF/Broken-Q4_0.gguf failed" in data["error"]
    assert "HTTP 500" in data["error"]
    assert "acme/Broken-GGUF:Q4_0" not in listed(server) and not staged(server)
    r = httpx.post(server.base_url + "/v1/models/pull", json={"model": "acme/safetensors-only", "stream": False})
    assert r.status_code == 404 and "no GGUF files" in r.json()["error"]


# ---------------------------------------------------------------- names and keys

HOSTILE = [
    "../../etc",
    "../../etc/passwd:latest",
    "hf.co/../../etc:Q4_0",
    "http://evil/x",
    "acme/x\x00y",
    "acme/" + "x" * 10_000,
    "llama3.2",
    "",
]


def test_hostile_names_are_refused_and_nothing_is_written(server: ServerProcess, base: Path) -> None:
    before = {p for p in base.rglob("*") if p.suffix != ".log"}
    for name in HOSTILE:
        for path, body in (("/api/pull", {"model": name}), ("/v1/models/pull", {"model": name, "stream": False})):
            r = httpx.post(server.base_url + path, json=body, timeout=10)
            assert r.status_code == 400, (path, name[:40], r.text)
            assert isinstance(r.json()["error"], str) and len(r.text) < 2000
    r = httpx.post(server.base_url + "/api/pull", json={"model": "llama3.2"})
    assert "hf.co/org/repo:QUANT" in r.json()["error"]
    r = httpx.post(server.base_url + "/api/pull", content=b'{"model": 3}', headers={"content-type": "application/json"})
    assert r.status_code == 400
    after = {p for p in base.rglob("*") if p.suffix != ".log"}
    assert after == before
    assert httpx.get(server.base_url + "/health").status_code == 200


def test_with_keys_only_a_key_that_manages_models_may_pull(keyed: ServerProcess) -> None:
    for path in ("/api/pull", "/v1/models/pull"):
        r = httpx.post(keyed.base_url + path, json={"model": "acme/Keyed-GGUF", "stream": False},
                       headers={"Authorization": f"Bearer {USER_KEY}"})  # fmt: skip
        assert r.status_code == 403 and "may not pull models" in r.json()["error"] and "manage=yes" in r.json()["error"]
        assert httpx.post(keyed.base_url + path, json={"model": "acme/Keyed-GGUF"}).status_code == 401
    admin = ollama.Client(host=keyed.base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert [p.status for p in admin.pull("acme/Keyed-GGUF:Q4_0", stream=True)][-1] == "success"
    r = httpx.post(keyed.base_url + "/v1/models/pull", json={"model": "acme/Keyed-GGUF:Q8_0", "stream": False},
                   headers={"x-api-key": FLAG_KEY}, timeout=60)  # fmt: skip
    assert r.status_code == 200 and r.json()["id"] == "acme/Keyed-GGUF:Q8_0"
    assert {"acme/Keyed-GGUF:Q4_0", "acme/Keyed-GGUF:Q8_0"} <= listed(keyed, USER_KEY)
