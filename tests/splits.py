"""Ways to cut a text into streamed pieces, for parsers that must not care where the cuts fall."""

from __future__ import annotations

import random


def chunkings(text: str, max_piece: int = 12) -> list[list[str]]:
    """Whole, char by char, every two-piece split, and five seeded random cuttings."""
    out = [[text], list(text)]
    out += [[text[:i], text[i:]] for i in range(1, len(text))]
    for seed in range(5):
        rng = random.Random(seed)
        pieces, i = [], 0
        while i < len(text):
            n = rng.randint(1, max_piece)
            pieces.append(text[i : i + n])
            i += n
        out.append(pieces)
    return out
