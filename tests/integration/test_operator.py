"""What an operator meets: start-up errors, logs, shutdown as a load balancer sees it, and a
machine that other programs keep busy. Real server, real worker, SmolLM2."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.conftest import MODEL
from tests.integration.test_lifecycle import (
    LONG,
    _orphans,
    client_for,
    gguf_path,
    import_copy,
    wait_for,
    workers,
)
from tests.server_proc import ServerProcess, free_port


def events(srv: ServerProcess) -> list[dict]:
    out = []
    for line in srv.log().splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def test_a_busy_port_is_one_clear_error_before_anything_is_announced(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        p = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--host", f"127.0.0.1:{port}",
                            "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode != 0
    out = (p.stdout + p.stderr).strip()
    assert out.splitlines()[-1] == f"error: cannot listen on 127.0.0.1:{port}: the address is already in use " \
                                   "(is another server running there?)"  # fmt: skip
    assert "geniex serving" not in out and "Traceback" not in out


def test_a_test_server_whose_port_was_taken_starts_again_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/server_proc: with two test processes, a drawn port can be taken before the server binds it."""
    import tests.server_proc as server_proc

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        draws = iter([busy])
        real = server_proc.free_port
        monkeypatch.setattr(server_proc, "free_port", lambda: next(draws, 0) or real())
        srv = server_proc.ServerProcess(tmp_path / "data")
        try:
            srv.wait_ready()
            assert srv.port != busy and httpx.get(f"{srv.base_url}/health", timeout=10).status_code == 200
            assert "already in use" in (tmp_path / "data" / f"server-{busy}.log").read_text()
        finally:
            srv.stop()


def test_unread_environment_variables_are_warned_about(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data", env={"GENIEX_NTCX": "8192", "GENIEX_DATA_DIR": str(tmp_path / "data")})
    try:
        srv.wait_ready()
        warned = [e for e in events(srv) if e.get("level") == "warning"]
        assert any(
            e["event"] == "GENIEX_NTCX is set, but no setting reads it (did you mean GENIEX_NCTX?)" for e in warned
        )
        assert not any("GENIEX_DATA_DIR" in e["event"] for e in warned)
    finally:
        srv.stop()


def test_geniex_data_dir_is_honoured_like_geniex_datadir(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENIEX_")}
    for name in ("GENIEX_DATA_DIR", "GENIEX_DATADIR"):
        target = tmp_path / name
        p = subprocess.run([sys.executable, "-m", "gateway.cli", "pull", "--local", gguf_path(), "test/copy:Q4_1"],
                           env={**env, name: str(target)}, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert p.returncode == 0, p.stderr
        assert (target / "models" / "test" / "copy").is_dir(), name


def test_usage_with_a_wrong_data_dir_says_there_is_no_ledger_there(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "gateway.cli", "usage", "--data-dir", str(tmp_path / "typo")],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 1
    assert f"there is no usage ledger in {tmp_path / 'typo'}" in p.stderr


def test_load_timeout_error_names_the_real_value(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "512", "--load-timeout-s", "0.05")
    r = httpx.post(f"{srv.base_url}/v1/chat/completions", json={"model": MODEL, "messages": LONG}, timeout=60)
    assert r.status_code == 503
    assert "did not become ready within 0.05s" in r.json()["error"]


def test_debug_log_shows_spawn_admission_and_eviction_choices(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "debug-data"
    other = import_copy(data, "test/other:Q4_1")
    srv = start("--nctx", "512", "--max-loaded", "1", "--log-level", "debug", data_dir=data)
    client = client_for(srv)
    client.chat.completions.create(
        model=MODEL, messages=LONG, max_tokens=2, extra_headers={"X-Request-ID": "first-one"}
    )
    client.chat.completions.create(model=other, messages=LONG, max_tokens=2)
    evs = events(srv)
    spawn = [e for e in evs if e["event"] == "worker command"]
    assert len(spawn) == 2 and "--nctx" in spawn[0]["argv"]
    admitted = [e for e in evs if e["event"] == "admitted"]
    assert admitted and admitted[0]["request_id"] == "first-one" and admitted[0]["reused_tokens"] == 0
    plans = [e for e in evs if e["event"] == "eviction plan"]
    assert plans[-1]["evict"] and plans[-1]["max_loaded"] == 1 and len(plans[-1]["residents"]) == 1
    # none of it at the default level
    quiet = start("--nctx", "512")
    client_for(quiet).chat.completions.create(model=MODEL, messages=LONG, max_tokens=2)
    assert not [e for e in events(quiet) if e.get("level") == "debug"]


def test_worker_death_is_logged_with_the_requests_in_flight(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "1024", "--crash-limit", "0")
    client = client_for(srv)
    client.chat.completions.create(model=MODEL, messages=LONG, max_tokens=1, extra_headers={"X-Request-ID": "starter"})
    stream = client.chat.completions.create(model=MODEL, messages=LONG, stream=True, max_tokens=500,
                                            extra_headers={"X-Request-ID": "victim"})  # fmt: skip
    it = iter(stream)
    next(it)
    os.kill(workers(srv)[0]["pid"], signal.SIGKILL)
    with pytest.raises(openai.APIError):
        for _ in it:
            pass
    died = [e for e in events(srv) if e["event"] == "worker died"]
    assert len(died) == 1
    assert died[0]["requests"] == ["victim"] and died[0].get("request_id") != "starter"


def test_sigterm_keeps_answering_ready_503_and_refuses_new_work_while_draining(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "512", "--drain-timeout-s", "60")
    client = client_for(srv)
    # 150 tokens outlast the three probes below by seconds, and the drain they wait on is that
    # stream's (300 made the drain, most of this test, twice as long and proved nothing more).
    stream = client.chat.completions.create(model=MODEL, messages=LONG, stream=True, max_tokens=150, temperature=0)
    it = iter(stream)
    next(it)
    pids = srv.worker_pids()
    srv.proc.send_signal(signal.SIGTERM)

    def draining() -> httpx.Response | None:  # polled, not a fixed sleep: the signal is handled at once
        r = httpx.get(f"{srv.base_url}/ready", timeout=5)
        return r if r.status_code == 503 else None

    ready = wait_for(draining, timeout=10, what="/ready to say draining")
    assert ready.status_code == 503 and "draining" in ready.json()["error"]
    assert httpx.get(f"{srv.base_url}/health", timeout=5).status_code == 200
    refused = httpx.post(f"{srv.base_url}/v1/chat/completions", json={"model": MODEL, "messages": LONG}, timeout=5)
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]
    assert int(refused.headers["retry-after"]) > 0
    chunks = list(it)
    assert chunks[-1].choices[0].finish_reason == "length", "the stream in flight finished during the drain"
    assert srv.proc.wait(30) == 0
    assert _orphans(pids) == []
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{srv.base_url}/health", timeout=2)


def _nices(pid: int) -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, t.id) for t in psutil.Process(pid).threads()}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux")
def test_workers_run_at_the_gateways_nice_and_answer_beside_a_busy_program(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "512", "--preload", MODEL)
    base = psutil.Process(srv.proc.pid).nice()
    row = workers(srv)[0]
    assert _nices(row["pid"]) == {base}
    assert row["cpu_features"], "the worker says which CPU features its llama.cpp build uses"
    # as its worker's Ready said
    assert any(d["name"] == "CPU" and d["kind"] == "cpu" for d in row["devices"]), row["devices"]
    hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    try:
        # 20 tokens, not 50: an answer in full beside the hog is what is proved, not its length
        r = client_for(srv).chat.completions.create(model=MODEL, messages=LONG, max_tokens=20, temperature=0,
                                                    timeout=120)  # a liveness bound, not a speed one  # fmt: skip
        assert r.usage.completion_tokens == 20
    finally:
        hog.kill()
        hog.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux")
def test_worker_nice_is_still_configurable(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "512", "--preload", MODEL, "--worker-nice", "10")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert _nices(workers(srv)[0]["pid"]) == {min(19, base + 10)}
    assert psutil.Process(srv.proc.pid).nice() == base  # the gateway itself is untouched


def test_requests_beyond_max_connections_get_a_json_503_and_probes_still_answer(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "512", "--max-connections", "2")
    client = client_for(srv)
    no_end = {"0": -100, "2": -100}  # SmolLM2's end tokens: the streams run until closed
    streams = [client.chat.completions.create(model=MODEL, messages=LONG, stream=True, max_tokens=400,
                                              logit_bias=no_end) for _ in range(2)]  # fmt: skip
    for s in streams:
        next(iter(s))
    refused = httpx.post(f"{srv.base_url}/v1/chat/completions", json={"model": MODEL, "messages": LONG}, timeout=10)
    assert refused.status_code == 503 and "--max-connections" in refused.json()["error"], refused.text
    assert refused.headers["retry-after"] == "1"
    assert httpx.get(f"{srv.base_url}/health", timeout=10).status_code == 200
    for s in streams:
        s.close()

    def served() -> httpx.Response | None:  # once the closed streams' requests have ended on the server
        r = httpx.post(f"{srv.base_url}/v1/chat/completions", json={"model": MODEL, "messages": LONG, "max_tokens": 1},
                       timeout=30)  # fmt: skip
        return r if r.status_code != 503 else None

    r = wait_for(served, timeout=30, what="a request served again")
    assert r.status_code == 200, r.text
