"""The chat model's streamed text cut into what Piper should say next: whole sentences, so the
voice's prosody is a sentence's, and the first one as soon as it ends, so speech starts while the
model is still writing. A long stretch without a sentence end is cut at a clause (`,` `;` `:`) or
a space rather than held back."""

from __future__ import annotations

import re

# A sentence ends at . ! ? (or a run of them, with closing quotes or brackets) before whitespace, or at a line break.
_END = re.compile(r"[.!?\u2026]+[\"')\]\u201d\u2019]*\s+|\n+")
LONG_CHARS = 160  # past this without a sentence end, cut at the last clause mark or space


class Sentences:
    def __init__(self) -> None:
        self._text = ""

    def feed(self, text: str) -> list[str]:
        """The sentences `text` completed (stripped, never empty)."""
        self._text += text
        out: list[str] = []
        while True:
            m = _END.search(self._text)
            if m is not None:
                cut = m.end()
            elif len(self._text) > LONG_CHARS:
                head = self._text[:LONG_CHARS]
                cut = max(head.rfind(","), head.rfind(";"), head.rfind(":"), head.rfind(" ")) + 1 or LONG_CHARS
            else:
                break
            sentence, self._text = self._text[:cut].strip(), self._text[cut:]
            if sentence:
                out.append(sentence)
        return out

    def rest(self) -> str:
        """What is left once the text has ended."""
        text, self._text = self._text.strip(), ""
        return text
