from gateway.supervisor.eviction import Resident, plan_evictions

GB = 1 << 30


def r(slug: str, idle: bool = True, last_used: float = 0.0, size: int = GB, npu: bool = False) -> Resident:
    return Resident(slug=slug, idle=idle, last_used=last_used, bytes=size, npu=npu)


def test_nothing_to_do_when_it_fits() -> None:
    assert plan_evictions([r("a")], need_bytes=GB, available_bytes=4 * GB, max_loaded=0) == []


def test_max_loaded_evicts_least_recently_used_idle() -> None:
    residents = [r("a", last_used=5), r("b", last_used=1), r("c", last_used=3)]
    assert plan_evictions(residents, need_bytes=1, available_bytes=100 * GB, max_loaded=3) == ["b"]
    assert plan_evictions(residents, need_bytes=1, available_bytes=100 * GB, max_loaded=2) == ["b", "c"]


def test_busy_workers_are_never_chosen() -> None:
    residents = [r("busy", idle=False, last_used=0), r("idle", last_used=9)]
    assert plan_evictions(residents, need_bytes=1, available_bytes=100 * GB, max_loaded=2) == ["idle"]
    assert plan_evictions([r("busy", idle=False)], need_bytes=1, available_bytes=100 * GB, max_loaded=1) is None


def test_memory_budget_evicts_until_it_fits() -> None:
    residents = [r("a", last_used=1, size=2 * GB), r("b", last_used=2, size=2 * GB), r("c", last_used=3)]
    assert plan_evictions(residents, need_bytes=3 * GB, available_bytes=GB, max_loaded=0) == ["a"]
    assert plan_evictions(residents, need_bytes=5 * GB, available_bytes=GB, max_loaded=0) == ["a", "b"]
    assert plan_evictions(residents, need_bytes=50 * GB, available_bytes=GB, max_loaded=0) is None


def test_npu_load_evicts_other_npu_workers_first() -> None:
    residents = [r("cpu1", last_used=0), r("npu1", last_used=9, npu=True)]
    assert plan_evictions(residents, need_bytes=1, available_bytes=100 * GB, max_loaded=0, npu=True) == ["npu1"]
    busy_npu = [r("npu1", idle=False, npu=True)]
    assert plan_evictions(busy_npu, need_bytes=1, available_bytes=100 * GB, max_loaded=0, npu=True) is None


def test_a_discrete_gpu_evicts_by_its_own_memory_too() -> None:
    """Host RAM is plenty; the GPU is full: the least recently used idle worker on the GPU goes."""
    from gateway.supervisor.eviction import plan_with_device

    host = [r("cpu-model", last_used=0), r("gpu-a", last_used=1), r("gpu-b", last_used=2)]
    on_gpu = [r("gpu-a", last_used=1, size=6 * GB), r("gpu-b", last_used=2, size=6 * GB)]
    kw = {"need_bytes": GB, "available_bytes": 100 * GB, "max_loaded": 0}
    assert plan_with_device(host, on_gpu, **kw, device_need=4 * GB, device_available=4 * GB) == []
    assert plan_with_device(host, on_gpu, **kw, device_need=8 * GB, device_available=2 * GB) == ["gpu-a"]
    assert plan_with_device(host, on_gpu, **kw, device_need=14 * GB, device_available=2 * GB) == ["gpu-a", "gpu-b"]
    assert plan_with_device(host, on_gpu, **kw, device_need=15 * GB, device_available=2 * GB) is None
    busy = [r("gpu-a", idle=False, last_used=1, size=6 * GB)]
    assert plan_with_device(host, busy, **kw, device_need=8 * GB, device_available=2 * GB) is None
    # what the host's plan evicts frees its GPU memory as well
    tight = {"need_bytes": 2 * GB, "available_bytes": GB, "max_loaded": 0}
    assert plan_with_device(host, on_gpu, **tight, device_need=8 * GB, device_available=2 * GB) == [
        "cpu-model",
        "gpu-a",
    ]
