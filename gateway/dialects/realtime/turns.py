"""Server VAD's turn taking, from the VAD worker's speech probabilities (one per VAD_WINDOW_MS of
audio): when speech starts and when it has stopped. Pure bookkeeping in milliseconds of the input
stream, so the rules are tested without a model.

As Silero's own segmenter does, speech ends only when the probability falls below a lower
threshold (`threshold - 0.15`) for `silence_duration_ms`, so a breath or a soft syllable does not
end a turn; and speech starts only after MIN_SPEECH_MS above `threshold`, so a click or a cough does
not interrupt a response (barge-in) or open a turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from protocol.wire import VAD_WINDOW_MS

MIN_SPEECH_MS = 96  # three windows
HYSTERESIS = 0.15


class Turn(NamedTuple):
    kind: Literal["started", "stopped"]
    ms: int  # started: where the speech began; stopped: where it ended (the silence's start)


@dataclass
class TurnTaker:
    threshold: float = 0.5
    silence_duration_ms: int = 500
    position_ms: int = 0  # the stream's audio analysed so far
    speaking: bool = False
    _run_start: int | None = None  # the first window above the threshold, not yet speech
    _silence_start: int | None = None

    def feed(self, probs: list[float]) -> list[Turn]:
        turns: list[Turn] = []
        low = max(0.0, self.threshold - HYSTERESIS)
        for p in probs:
            at = self.position_ms
            self.position_ms += VAD_WINDOW_MS
            if not self.speaking:
                if p >= self.threshold:
                    self._run_start = at if self._run_start is None else self._run_start
                    if self.position_ms - self._run_start >= MIN_SPEECH_MS:
                        self.speaking, self._silence_start = True, None
                        turns.append(Turn("started", self._run_start))
                else:
                    self._run_start = None
                continue
            if p >= low:
                self._silence_start = None
            elif self._silence_start is None:
                self._silence_start = at
            if self._silence_start is not None and self.position_ms - self._silence_start >= self.silence_duration_ms:
                self.speaking, self._run_start = False, None
                turns.append(Turn("stopped", self._silence_start))
                self._silence_start = None
        return turns

    def cut(self) -> Turn | None:
        """End the speech now (its audio reached the bound of one turn); None when there is none."""
        if not self.speaking:
            return None
        self.speaking, self._run_start, self._silence_start = False, None, None
        return Turn("stopped", self.position_ms)
