"""Turns a token's bytes into client text: UTF-8 safe, with stop strings held back.

A stop string may arrive split over several tokens, so any tail of the text that
could still become a stop string is held until the next token decides it.
"""

from __future__ import annotations

import codecs


class TextStream:
    def __init__(self, stop: list[str]) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [s for s in stop if s]
        self._held = ""
        self.stopped = False
        self.matched = ""  # the stop string that stopped the text (the earliest, when several appear)

    def feed(self, piece: bytes) -> str:
        """Text that is safe to send now. Sets `stopped` when a stop string appeared."""
        text = self._held + self._utf8.decode(piece)
        if not self._stop:
            self._held = ""
            return text
        found = [(i, s) for s in self._stop if (i := text.find(s)) >= 0]
        if found:
            cut, self.matched = min(found, key=lambda f: f[0])
            self._held = ""
            self.stopped = True
            return text[:cut]
        keep = self._held_tail(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The rest, at the end of generation (a held partial stop string is real text)."""
        text = self._held + self._utf8.decode(b"", final=True)
        self._held = ""
        return text

    def _held_tail(self, text: str) -> int:
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
