"""A laptop's scheduler on the real server and SmolLM2: the interactive request's first token
before a background one's, each answer's energy from a (fake) RAPL counter in usage, the ledger
and /metrics, and `--on-battery cap-threads` following the charger.

The server reads sysfs under GENIEX_SYSFS_ROOT: a tree this module writes, with a RAPL package
counter a thread advances (0.2 J every 10 ms, a 20 W machine) and a mains supply beside a battery.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from tests.conftest import MODEL
from tests.integration.test_ops import sample
from tests.server_proc import ServerProcess, serving

WATTS = 20.0


class FakeMachine:
    """A sysfs tree: /sys/class/powercap/intel-rapl:0 counting up, and a charger that can be pulled."""

    def __init__(self, root: Path) -> None:
        self.root = root
        rapl = root / "sys/class/powercap/intel-rapl:0"
        rapl.mkdir(parents=True)
        (rapl / "name").write_text("package-0\n")
        (rapl / "max_energy_range_uj").write_text(f"{2**40}\n")
        self.counter = rapl / "energy_uj"
        self.counter.write_text("0\n")
        for name, kind in (("AC", "Mains"), ("BAT0", "Battery")):
            (root / "sys/class/power_supply" / name).mkdir(parents=True)
            (root / "sys/class/power_supply" / name / "type").write_text(kind + "\n")
        self.plug(True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def plug(self, on: bool) -> None:
        (self.root / "sys/class/power_supply/AC/online").write_text("1\n" if on else "0\n")

    def _run(self) -> None:
        uj = 0
        while not self._stop.wait(0.01):
            uj += int(WATTS * 0.01 * 1e6)
            tmp = self.counter.with_suffix(".tmp")
            tmp.write_text(f"{uj}\n")
            tmp.replace(self.counter)  # whole, never half written

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeMachine]:
    m = FakeMachine(tmp_path_factory.mktemp("sysfs"))
    yield m
    m.close()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, machine: FakeMachine) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory.mktemp("laptop"), "--parallel", "2", "--on-battery", "cap-threads",
                 env={"GENIEX_SYSFS_ROOT": str(machine.root)}) as s:  # fmt: skip
        yield s


def client(srv: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="x", max_retries=0, timeout=300)


def async_client(srv: ServerProcess, priority: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{srv.base_url}/v1", api_key="x", max_retries=0, timeout=300,
                              default_headers={"GenieX-Priority": priority})  # fmt: skip


async def first_token(stream: Any, at: dict[str, float], name: str) -> None:
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            at[name] = time.monotonic()
            return


async def test_an_interactive_request_gets_its_first_token_before_a_background_prefill_ends(srv: ServerProcess) -> None:
    """Without priority the background prompt's chunks fill every step's batch until it is all in,
    and the short question waits behind it; with it, the question's prefill and decode go first.
    Once the question has its first token the background request is left (cancelled), not waited for."""
    notes = " ".join(f"Entry {i}: the agent read file {i} and found nothing new." for i in range(160))
    at: dict[str, float] = {}
    background = await async_client(srv, "background").chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"[{time.time()}] {notes}\nSummarise."}],
        max_tokens=4, temperature=0, stream=True)  # fmt: skip
    agent = asyncio.create_task(first_token(background, at, "background"))  # its prompt is admitted and prefilling
    person = await async_client(srv, "interactive").chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4, temperature=0, stream=True
    )
    await first_token(person, at, "interactive")
    answered_first = "background" not in at
    agent.cancel()
    await asyncio.gather(agent, return_exceptions=True)
    await background.close()
    await person.close()
    assert "interactive" in at, at
    assert answered_first, f"the background answer began {at['interactive'] - at['background']:.3f} s first"


def test_a_priority_header_that_names_none_is_a_400(srv: ServerProcess) -> None:
    r = httpx.post(f"{srv.base_url}/v1/chat/completions", headers={"GenieX-Priority": "urgent"}, timeout=30,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})  # fmt: skip
    assert r.status_code == 400 and "GenieX-Priority" in r.json()["error"]


def test_each_answer_carries_its_energy_and_the_ledger_and_metrics_count_it(srv: ServerProcess) -> None:
    def metric() -> float:
        try:
            return sample(httpx.get(f"{srv.base_url}/metrics", timeout=10).text, "geniex:energy_joules_total",
                          model=MODEL, compute="cpu")  # fmt: skip
        except AssertionError:  # not counted yet
            return 0.0

    before = metric()
    answer = client(srv).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count from one to twenty."}], max_tokens=48,
        temperature=0, extra_body={"logit_bias": {"0": -100, "2": -100}})  # fmt: skip
    usage = answer.usage
    assert usage is not None and usage.completion_tokens == 48
    energy = (usage.model_extra or {}).get("energy_j")
    assert isinstance(energy, float) and energy > 0, usage
    assert metric() - before == pytest.approx(energy, abs=1e-3)
    rows = httpx.get(f"{srv.base_url}/v1/usage", timeout=10).json()["data"]
    assert sum(r["energy_j"] for r in rows) >= energy and sum(r["energy_tokens"] for r in rows) > 0
    # The other dialects carry it too.
    r = httpx.post(f"{srv.base_url}/v1/messages", timeout=60, headers={"anthropic-version": "2023-06-01"},
                   json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})  # fmt: skip
    assert r.json()["usage"]["energy_j"] > 0
    r = httpx.post(
        f"{srv.base_url}/v1/responses", timeout=60, json={"model": MODEL, "input": "Hi", "max_output_tokens": 8}
    )
    assert r.json()["usage"]["energy_j"] > 0
    r = httpx.post(f"{srv.base_url}/api/chat", timeout=60, json={"model": MODEL, "stream": False,
                   "messages": [{"role": "user", "content": "Hi"}], "options": {"num_predict": 8}})  # fmt: skip
    assert r.json()["energy_j"] > 0


def test_on_battery_caps_the_threads_and_says_so(srv: ServerProcess, machine: FakeMachine) -> None:
    def power() -> dict[str, Any]:
        return httpx.get(f"{srv.base_url}/v1/workers", timeout=10).json()["power"]

    assert power()["source"] == "mains" and not power()["applied"]
    machine.plug(False)
    try:
        deadline = time.monotonic() + 30
        while power()["source"] != "battery" and time.monotonic() < deadline:
            time.sleep(0.5)
        got = power()
        assert (got["source"], got["policy"], got["applied"]) == ("battery", "cap-threads", True), got
        assert "power source changed" in srv.log()
        client(srv).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        rows = httpx.get(f"{srv.base_url}/v1/workers", timeout=10).json()["data"]
        cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1  # as the pool counts them
        [worker] = [w for w in rows if w["model"] == MODEL]
        assert worker["threads"] == max(1, cores // 2), worker
    finally:
        machine.plug(True)
