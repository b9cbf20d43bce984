"""`--on-battery` (gateway/supervisor/on_battery.py): the policy follows the power source as it
changes, caps the CPU workers' threads or sends unit-less requests to the NPU, and says so."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.supervisor.on_battery import BatteryPolicy
from protocol.power import battery_state


def test_cap_threads_halves_the_cores_only_on_battery() -> None:
    source = [False]
    policy = BatteryPolicy("cap-threads", read=lambda: source[0])
    assert policy.thread_cap(8) is None and not policy.applied and policy.info().source == "mains"
    source[0] = True
    assert policy.check() and policy.applied
    assert policy.thread_cap(8) == 4 and policy.thread_cap(1) == 1
    assert policy.compute(None) is None  # this policy leaves the unit alone
    info = policy.info()
    assert (info.source, info.policy, info.applied) == ("battery", "cap-threads", True)
    assert not policy.check()  # unchanged: nothing to do


def test_prefer_npu_only_for_requests_that_name_no_unit() -> None:
    policy = BatteryPolicy("prefer-npu", read=lambda: True)
    assert policy.compute(None) == "npu" and policy.compute("cpu") == "cpu" and policy.compute("gpu") == "gpu"
    assert policy.thread_cap(8) is None


def test_none_reads_nothing_and_changes_nothing() -> None:
    def never() -> bool:
        raise AssertionError("the `none` policy reads no power source")

    policy = BatteryPolicy("none", read=never)
    assert policy.compute(None) is None and policy.thread_cap(8) is None and policy.info().source == "unknown"


def test_the_watcher_calls_back_when_the_charger_is_pulled(tmp_path: Path) -> None:
    supplies = tmp_path / "sys/class/power_supply"
    for name, kind in (("AC", "Mains"), ("BAT0", "Battery")):
        (supplies / name).mkdir(parents=True)
        (supplies / name / "type").write_text(kind + "\n")
    (supplies / "AC" / "online").write_text("1\n")
    policy = BatteryPolicy("cap-threads", read=lambda: battery_state(supplies))
    assert policy.on_battery is False
    changes: list[bool | None] = []

    async def go() -> None:
        task = asyncio.create_task(policy.watch(lambda: changes.append(policy.on_battery), interval=0.01))
        (supplies / "AC" / "online").write_text("0\n")
        for _ in range(500):
            if changes:
                break
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(go())
    assert changes == [True] and policy.thread_cap(4) == 2


def test_the_pool_asks_the_npu_for_a_unit_less_request_on_battery(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.models.store import ModelEntry
    from gateway.ops.settings import Settings
    from gateway.supervisor import compute
    from gateway.supervisor.pool import WorkerPool
    from protocol import qnn

    monkeypatch.setattr(qnn, "is_simulated", lambda: False)  # a Snapdragon
    monkeypatch.setattr(qnn, "_installed", lambda: True)
    pool = WorkerPool.__new__(WorkerPool)  # key_for reads only the settings and the policy
    pool.settings = Settings()
    pool.battery = BatteryPolicy("prefer-npu", read=lambda: True)
    entry = ModelEntry(id="o/r:Q4_0", org="o", repo="r", precision="Q4_0", engine="llama_cpp",
                       path="/nonexistent.gguf", size=1, created=0)  # fmt: skip
    assert compute.resolve_compute("npu", "llama_cpp") == "npu"
    assert pool.key_for(entry, None, None, None).compute == "npu"
    assert pool.key_for(entry, None, "cpu", None).compute == "cpu"
    pool.battery = BatteryPolicy("prefer-npu", read=lambda: False)
    assert pool.key_for(entry, None, None, None).compute == "cpu"
