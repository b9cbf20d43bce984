"""Small statistics helpers (no numpy needed)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def pct(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear interpolation between closest ranks."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(values: Sequence[float | None]) -> dict:
    """median, min, max, spread ((max - min) / median) and all values, rounded for the report."""
    xs = [v for v in values if v is not None]
    if not xs:
        return {"median": None, "min": None, "max": None, "spread": None, "n": 0, "all": []}
    med = statistics.median(xs)
    return {
        "median": round(med, 3),
        "min": round(min(xs), 3),
        "max": round(max(xs), 3),
        "spread": round((max(xs) - min(xs)) / med, 3) if med else None,
        "n": len(xs),
        "all": [round(x, 3) for x in xs],
    }


def med(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None
