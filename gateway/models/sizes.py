"""Sizes as the model commands print them."""

from __future__ import annotations


def human_size(n: int) -> str:
    """Decimal units, as disk sizes and the hub show them: 98362432 -> '98.4 MB'."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"
