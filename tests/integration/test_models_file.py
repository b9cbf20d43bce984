"""The models file on a real server and real SmolLM2: an alias answers and is billed under the model's
id, a model's defaults (nctx, parallel, KV type, temperature, system prompt, keep_alive) apply when a
request sets none and a request's own win, hidden and disabled models, and edits that take effect
without a restart while requests keep being answered. One server for the module."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import MODEL
from tests.integration.test_logits import gguf_path
from tests.server_proc import ServerProcess, free_port, serving

OTHER = "test/other:Q4_1"  # the bundled GGUF again, under another id: hidden
OFF = "test/off:Q4_1"  # and again: disabled
ALIAS = "gpt-4o-mini"

FIRST = f"""\
["{MODEL}"]
aliases = ["{ALIAS}"]
temperature = 0.0
nctx = 8192
parallel = 1
cache_type_k = "q8_0"
system = "You are terse."
keep_alive = -1
preload = true

["{OTHER}"]
hidden = true

["{OFF}"]
disabled = true
"""
# The alias now names OTHER, and MODEL's next worker gets another context.
SECOND = (
    FIRST.replace(f'aliases = ["{ALIAS}"]\n', "")
    .replace("nctx = 8192", "nctx = 4096")
    .replace("hidden = true", f'hidden = true\naliases = ["{ALIAS}"]')
)


def _pull(data: Path, name: str) -> None:
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "pull", "--local", gguf_path(), name,
                           "--data-dir", str(data)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def models_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "models.toml"
    path.write_text(FIRST)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, models_file: Path) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("data")
    for name in (OTHER, OFF):
        _pull(data, name)
    # --keep-alive-s 1: an idle worker goes within a second or so, unless its model's keep_alive pins it
    with serving(data, "--nctx", "2048", "--keep-alive-s", "1", "--cache-ram-mb", "0", "--cache-disk", "0",
                 "--models-file", str(models_file)) as srv:  # fmt: skip
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _ask(client: openai.OpenAI, model: str, **extra: object) -> openai.types.chat.ChatCompletion:
    messages = extra.pop("messages", [{"role": "user", "content": "Name a colour."}])
    return client.chat.completions.create(model=model, messages=messages, max_tokens=8, **extra)  # type: ignore[call-overload]


def _workers(server: ServerProcess) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = httpx.get(f"{server.base_url}/v1/workers", timeout=10).json()["data"]
    return rows


def test_preload_loads_the_model_before_ready_with_its_defaults(server: ServerProcess) -> None:
    assert [(w["model"], w["nctx"]) for w in _workers(server)] == [(MODEL, 8192)]


def test_an_alias_answers_and_is_billed_under_the_models_id(server: ServerProcess, client: openai.OpenAI) -> None:
    answer = _ask(client, ALIAS)
    assert answer.model == MODEL and answer.choices[0].message.content
    usage = subprocess.run([sys.executable, "-m", "gateway.cli", "usage", "--json", "--data-dir",
                            str(server.data_dir)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert usage.returncode == 0, usage.stderr
    rows = json.loads(usage.stdout)
    assert [r["model"] for r in rows] == [MODEL] and rows[0]["requests"] == 1, rows
    summary = [json.loads(line) for line in server.log().splitlines()
               if line.startswith("{") and '"event": "request"' in line and "model_alias" in line]  # fmt: skip
    assert [(e["model_alias"], e["status"]) for e in summary] == [(ALIAS, 200)], summary  # the alias, recorded


def test_the_files_nctx_parallel_and_kv_type_start_the_worker_and_a_requests_nctx_wins(
    server: ServerProcess, client: openai.OpenAI
) -> None:
    _ask(client, MODEL)
    mine = [w for w in _workers(server) if w["model"] == MODEL]
    assert [(w["nctx"], w["parallel"], w["cache_type_k"]) for w in mine] == [(8192, 1, "q8_0")], mine
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi."}], max_tokens=2,
                                   extra_body={"nctx": 1024})  # fmt: skip
    assert sorted(w["nctx"] for w in _workers(server) if w["model"] == MODEL) == [1024, 8192]


def test_a_default_temperature_of_zero_makes_answers_greedy(client: openai.OpenAI) -> None:
    greedy = _ask(client, MODEL, temperature=0).choices[0].message.content
    by_default = {_ask(client, MODEL, seed=seed).choices[0].message.content for seed in (1, 2, 3)}
    assert by_default == {greedy}
    hot = {_ask(client, MODEL, seed=seed, temperature=2.0).choices[0].message.content for seed in (1, 2, 3, 4)}
    assert len(hot) > 1, "these seeds vary the answer at a temperature the request sets"


def test_the_default_system_prompt_is_used_only_when_the_request_has_none(client: openai.OpenAI) -> None:
    user = {"role": "user", "content": "Hi."}

    def prompt_tokens(model: str, *messages: dict[str, str]) -> int:
        usage = _ask(client, model, messages=[*messages, user]).usage
        assert usage is not None
        return usage.prompt_tokens

    # OTHER is the same GGUF without defaults: MODEL's prompt without a system message is OTHER's
    # with the file's system prompt, and a request's own system prompt is left as it is.
    assert prompt_tokens(MODEL) == prompt_tokens(OTHER, {"role": "system", "content": "You are terse."})
    assert prompt_tokens(MODEL) != prompt_tokens(OTHER)
    own = {"role": "system", "content": "Answer in French, please, in one word."}
    assert prompt_tokens(MODEL, own) == prompt_tokens(OTHER, own)
    developer = {"role": "developer", "content": "Answer in French, please, in one word."}
    assert prompt_tokens(MODEL, developer) == prompt_tokens(OTHER, developer)


def test_a_hidden_model_is_served_and_a_disabled_one_refused_by_name(client: openai.OpenAI) -> None:
    assert _ask(client, OTHER).model == OTHER
    listed = {m.id: m for m in client.models.list()}
    assert OTHER not in listed and OFF not in listed and MODEL in listed
    assert (listed[MODEL].model_extra or {}).get("aliases") == [ALIAS]
    assert client.models.retrieve(ALIAS).id == MODEL
    with pytest.raises(openai.NotFoundError) as err:
        _ask(client, OFF)
    assert f"{OFF}' is disabled by the models file" in err.value.response.text, err.value.response.text
    with pytest.raises(openai.NotFoundError) as err:
        _ask(client, "test/off")  # by another name of it
    assert "disabled by the models file" in err.value.response.text


def test_keep_alive_minus_one_survives_the_idle_reaper(server: ServerProcess, client: openai.OpenAI) -> None:
    _ask(client, OTHER)
    time.sleep(3)  # --keep-alive-s 1, reaped every 0.25 s
    left = {(w["model"], w["keep_alive_s"]) for w in _workers(server)}
    assert left == {(MODEL, -1.0)}, left  # both of MODEL's workers (nctx 8192 and 1024) stay; OTHER's went


def test_edits_apply_without_a_restart_and_a_bad_edit_keeps_the_file_before(
    server: ServerProcess, client: openai.OpenAI, models_file: Path
) -> None:
    failures: list[BaseException] = []
    answered: list[str] = []
    stop = threading.Event()

    def keep_asking() -> None:
        while not stop.is_set():
            try:
                stream = client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "Hi."}],
                                                        max_tokens=8, stream=True)  # fmt: skip
                answered.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
            except BaseException as exc:  # noqa: BLE001 - collected, asserted below
                failures.append(exc)

    asker = threading.Thread(target=keep_asking)
    asker.start()
    try:
        time.sleep(0.5)
        models_file.write_text(SECOND)
        deadline = time.monotonic() + 15
        while _ask(client, ALIAS).model != OTHER:
            assert time.monotonic() < deadline, "the edit did not take effect:\n" + server.log()[-3000:]
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        stop.set()
        asker.join(60)
    assert not failures, failures
    assert answered
    log = server.log()
    assert "applies to the next worker" in log and "nctx" in log

    models_file.write_text(SECOND.replace("hidden = true", "hidden = true\ntemprature = 0.5"))
    deadline = time.monotonic() + 15
    while "temprature" not in server.log():
        assert time.monotonic() < deadline, "the bad edit was not logged"
        time.sleep(0.2)
    line = next(line for line in server.log().splitlines() if "temprature" in line)
    assert str(models_file) in line and f"[{OTHER}]" in line and "unknown key" in line, line
    assert _ask(client, ALIAS).model == OTHER, "the version before stays"

    # SIGHUP reads it again too (an mtime put back as it was: only the signal can tell)
    stamp = models_file.stat()
    back = FIRST.ljust(stamp.st_size - 1) + "\n"
    models_file.write_text(back)
    os.utime(models_file, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    server.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 15
    while _ask(client, ALIAS).model != MODEL:
        assert time.monotonic() < deadline, "SIGHUP did not read the file again:\n" + server.log()[-3000:]
        time.sleep(0.2)
    assert "SIGHUP" in server.log()


def test_an_invalid_file_stops_the_start_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "models.toml"
    bad.write_text(f'["{MODEL}"]\naliases = ["{MODEL}"]\n')
    p = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--host", f"127.0.0.1:{free_port()}",
                        "--data-dir", str(tmp_path / "data"), "--models-file", str(bad)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode != 0
    assert f"error: --models-file: {bad}: table [{MODEL}]: key `aliases`" in p.stderr, p.stderr
