"""Which resident workers to stop so a new one fits: a pure function, tested on its own."""

from __future__ import annotations

import msgspec


class Resident(msgspec.Struct, frozen=True):
    """What the policy needs to know of one resident worker."""

    slug: str
    idle: bool  # ready, with nothing running or queued
    last_used: float
    bytes: int
    npu: bool = False


def plan_evictions(
    residents: list[Resident],
    *,
    need_bytes: int,
    available_bytes: int,
    max_loaded: int,
    npu: bool = False,
) -> list[str] | None:
    """Slugs to evict, least recently used idle first; None when no plan makes room.

    A worker that is busy or has queued requests is never chosen. `max_loaded` 0 means
    no count limit. Loading an NPU model evicts the other NPU workers first, since the
    NPU is one small shared device.
    """
    chosen: list[str] = []
    if npu:
        npu_residents = [r for r in residents if r.npu]
        if any(not r.idle for r in npu_residents):
            return None
        chosen = [r.slug for r in npu_residents]
    freed = sum(r.bytes for r in residents if r.slug in chosen)
    count = len(residents) - len(chosen)

    def fits() -> bool:
        return need_bytes <= available_bytes + freed and (max_loaded <= 0 or count + 1 <= max_loaded)

    for r in sorted((r for r in residents if r.idle and r.slug not in chosen), key=lambda r: r.last_used):
        if fits():
            break
        chosen.append(r.slug)
        freed += r.bytes
        count -= 1
    return chosen if fits() else None


def plan_with_device(
    residents: list[Resident],
    device_residents: list[Resident],
    *,
    need_bytes: int,
    available_bytes: int,
    max_loaded: int,
    npu: bool = False,
    device_need: int = 0,
    device_available: int = 0,
) -> list[str] | None:
    """`plan_evictions` for the host's RAM, then for one device's own memory (a discrete GPU's):
    `device_residents` are the workers with layers on that device, their `bytes` what they hold
    there. What the host's plan evicts frees its device bytes too; more idle workers on the device
    go, least recently used first, when the new one's `device_need` still does not fit."""
    plan = plan_evictions(residents, need_bytes=need_bytes, available_bytes=available_bytes,
                          max_loaded=max_loaded, npu=npu)  # fmt: skip
    if plan is None or device_need <= 0:
        return plan
    freed = sum(r.bytes for r in device_residents if r.slug in plan)
    rest = [r for r in device_residents if r.slug not in plan]
    more = plan_evictions(rest, need_bytes=device_need, available_bytes=device_available + freed, max_loaded=0)
    return None if more is None else plan + more
