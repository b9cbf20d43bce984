"""The prompt cache's tenants on the real engine, in RAM and on disk: a conversation survives its
worker being unloaded and the server restarting (restored from the data dir's prompt-cache/, the
same greedy answer as a cold run), never crosses to another tenant, survives a corrupt, foreign or
truncated state file (skipped, the answer still right), and the disk tier keeps to its cap."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest

from tests.conftest import MODEL
from tests.integration.test_lifecycle import client_for, wait_for, workers
from tests.integration.test_prompt_cache import SYSTEM, same_answer
from tests.server_proc import ServerProcess
from workers.engines.llama import disk_cache

# About 500 tokens with SmolLM2's template: a system prompt and a few facts, a state of about 11 MB.
# Enough that a restore shows in cached_tokens; the restart test prefills it cold three times, and
# at 2,000 tokens those prefills were most of the module's time (what is proven does not grow with it).
LONG_SYSTEM = SYSTEM + " " + " ".join(f"Fact {i}: item {i} weighs {i * 7 % 13} kilograms." for i in range(20))
# About 150 tokens (a state of about 3.5 MB): above the 64 a state needs to be saved at all
# (slots.MIN_SAVE_TOKENS), for the tests where what a state holds does not matter, only that it exists.
SHORT_SYSTEM = "You are a helpful assistant. " + " ".join(
    f"Rule {i}: always be kind and precise about topic number {i}." for i in range(8)
)


def chat(client: openai.OpenAI, messages: list[dict[str, str]], salt: str = "", **body: Any) -> tuple[str, int, int]:
    """(answer, prompt tokens, cached prompt tokens) of one greedy turn of tenant `salt`."""
    extra = {**({"cache_salt": salt} if salt else {}), **body}
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,  # type: ignore[arg-type]
                                       extra_body=extra or None)  # fmt: skip
    assert r.usage is not None
    details = r.usage.prompt_tokens_details
    return r.choices[0].message.content or "", r.usage.prompt_tokens, (details.cached_tokens or 0) if details else 0


def ask(question: str, system: str = SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def unload(srv: ServerProcess) -> None:
    r = httpx.post(f"{srv.base_url}/v1/models/unload", json={"model": MODEL}, timeout=60)
    assert r.status_code == 200, r.text
    wait_for(lambda: not workers(srv), what="the worker to go")


def state_files(data: Path) -> list[Path]:
    return sorted((data / "prompt-cache").glob("*/*.kv"))


def test_the_ram_tier_never_hands_one_tenants_prefix_to_another(start) -> None:  # type: ignore[no-untyped-def]
    """A's conversation is pushed out of the only slot into the RAM tier by A's next one; B then
    sends A's conversation word for word and reuses none of it; A does."""
    client = client_for(start("--nctx", "2048", "--parallel", "1", "--cache-disk", "0"))
    first, second = ask("What is rule 3?", SHORT_SYSTEM), ask("Name a color.", system="Be brief.")
    _, prompt, _ = chat(client, first, "A")
    chat(client, second, "A")  # takes the slot: `first` goes to the RAM tier
    assert chat(client, first, "B")[2] == 0
    chat(client, second, "A")
    assert chat(client, first, "A")[2] >= prompt - 1  # restored from the RAM tier


def test_a_conversation_survives_its_worker_and_a_restart(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    srv = start("--nctx", "2048", "--parallel", "1", data_dir=data)
    client = client_for(srv)
    turn1 = ask("What does item 7 weigh?", system=LONG_SYSTEM)
    answer1, prompt1, _ = chat(client, turn1)
    assert prompt1 > 450, prompt1
    turn2 = [*turn1, {"role": "assistant", "content": answer1}, {"role": "user", "content": "And item 8?"}]
    unload(srv)  # the worker goes: its slot's KV is written to disk
    files = state_files(data)
    assert len(files) == 1 and oct(files[0].stat().st_mode & 0o777) == "0o600", files
    assert oct(files[0].parent.parent.stat().st_mode & 0o777) == "0o700"
    assert re.fullmatch(r"[0-9a-f]{32}\.kv", files[0].name), files[0].name  # a hash, not the prompt or tenant
    answer2, _, cached2 = chat(client, turn2)
    assert cached2 >= prompt1, (cached2, prompt1)
    row = workers(srv)[0]
    assert row["disk_cache_hits"] == 1 and row["disk_cache_bytes"] > 0, row
    metrics = httpx.get(f"{srv.base_url}/metrics").text
    assert "geniex:prompt_cache_disk_hits_total" in metrics
    cold, _, none = chat(client, turn2, cache_prompt=False)
    assert none == 0 and same_answer(cold, answer2), (cold, answer2)

    # Another tenant restores nothing of it, from disk either.
    unload(srv)
    assert chat(client, turn2, "B")[2] == 0

    # A restart on the same data dir (the gateway stopped gracefully, as systemd stops it).
    srv.stop(signal.SIGTERM)
    client = client_for(start("--nctx", "2048", "--parallel", "1", data_dir=data))
    again, _, cached = chat(client, turn2)
    assert cached >= prompt1 and same_answer(again, answer2), (cached, again, answer2)


def test_corrupt_foreign_and_truncated_state_files_are_skipped(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    srv = start("--nctx", "2048", "--parallel", "1", data_dir=data)
    client = client_for(srv)
    messages = {
        name: ask(f"What is rule {n}?", SHORT_SYSTEM) for name, n in (("corrupt", 2), ("foreign", 4), ("cut", 6))
    }
    cold = {}
    for name, m in messages.items():
        cold[name] = chat(client, m, name)[0]  # one tenant each: three states
    unload(srv)
    files = state_files(data)
    assert len(files) == 3, files
    corrupt, foreign, cut = files  # whose each is does not matter: all three are damaged
    raw = bytearray(corrupt.read_bytes())
    raw[-100:] = bytes(100)  # the state's last bytes: the checksum no longer matches
    corrupt.write_bytes(bytes(raw))
    data_bytes = foreign.read_bytes()  # as if another model had written it
    start_at = len(disk_cache.MAGIC) + 4
    n = int.from_bytes(data_bytes[len(disk_cache.MAGIC) : start_at], "little")
    header = msgspec.msgpack.decode(data_bytes[start_at : start_at + n], type=disk_cache.Header)
    other = msgspec.msgpack.encode(msgspec.structs.replace(header, fingerprint="0" * 32))
    foreign.write_bytes(disk_cache.MAGIC + len(other).to_bytes(4, "little") + other + data_bytes[start_at + n :])
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    for name, m in messages.items():
        answer, _, cached = chat(client, m, name)
        assert cached == 0 and same_answer(answer, cold[name]), (name, cached, answer, cold[name])
    log = srv.log()
    assert log.count("prompt state skipped and deleted") >= 3, log[-3000:]
    assert not [f for f in (corrupt, foreign, cut) if f.exists()]


def test_the_disk_tier_keeps_to_its_cap(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    # States of about 3.5 MB under a 4 MiB cap: each write past the first must evict to keep to it.
    client = client_for(start("--nctx", "1024", "--parallel", "1", "--cache-ram", "0", "--cache-disk", "4",
                              data_dir=data))  # fmt: skip
    for i in range(6):  # each conversation pushes the last one out of the slot, and so to disk
        chat(client, ask(f"What is rule {i}?", SHORT_SYSTEM), f"tenant{i}")
        size = sum(f.stat().st_size for f in state_files(data))
        assert size <= 4 << 20, (i, size)
    # The states are written by the worker's writer thread, after the answer that pushed them out.
    wait_for(lambda: state_files(data), what="a state on disk")


@pytest.mark.parametrize("value", ["-1", str(2**60)])
def test_a_cache_disk_out_of_bounds_stops_the_start(tmp_path: Path, value: str) -> None:
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--data-dir", str(tmp_path), "--cache-disk",
                           value], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0 and "--cache-disk" in done.stderr, done.stderr
