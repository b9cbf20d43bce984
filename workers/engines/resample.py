"""Sample-rate conversion in numpy for the speech engines: a windowed-sinc polyphase FIR whose
carry between blocks is plain numbers (so the stateless VAD worker can hand it to the gateway and
back), and which needs no PyAV (Piper's install has none). Server VAD resamples 24 kHz input to
Silero's 16 kHz; Piper resamples its voice to the rate a Speak asks for (24 kHz for realtime)."""

from __future__ import annotations

import math

import numpy as np

# The resampler's filter: pass up to PASS of the lower rate's Nyquist frequency, stop by that
# frequency at least STOP_DB down (a Kaiser window sized for that transition).
PASS = 0.85
STOP_DB = 70.0
BLOCK = 4096  # outputs computed at a time: bounds the gathered input (BLOCK x taps floats)


class Resampler:
    """`rate_in` to `rate_out` by a windowed-sinc polyphase FIR (upsample by `up`, low-pass,
    keep every `down`-th sample), fed a block at a time. Between blocks a stream keeps `history`
    (the last taps - 1 input samples) and `position` (where its next output falls, in upsampled
    samples from the start of history + the next block), so blocks of any size join seamlessly.
    The filter's delay is taken out: output sample k is the input at time k / rate_out."""

    def __init__(self, rate_in: int, rate_out: int) -> None:
        g = math.gcd(rate_in, rate_out)
        self.up, self.down = rate_out // g, rate_in // g
        fs = rate_in * self.up  # the upsampled rate the filter runs at
        nyquist = min(rate_in, rate_out) / 2
        width = (1 - PASS) * nyquist / fs  # transition, in cycles per upsampled sample
        n = math.ceil((STOP_DB - 7.95) / (2.285 * 2 * math.pi * width)) + 1
        self.taps = -(-n // self.up)  # per phase
        length = self.taps * self.up - (1 - self.taps * self.up % 2)  # odd: a whole-sample delay
        self.delay = (length - 1) // 2
        cutoff = (1 + PASS) / 2 * nyquist / fs
        t = np.arange(length) - self.delay
        proto = 2 * cutoff * np.sinc(2 * cutoff * t) * np.kaiser(length, 0.1102 * (STOP_DB - 8.7))
        proto = np.pad(proto, (0, self.taps * self.up - length))
        phases = proto.reshape(self.taps, self.up).T  # phases[p, m] = proto[p + m * up]
        phases = phases / phases.sum(axis=1, keepdims=True)  # every phase passes DC at gain 1
        # Reversed, so that a phase multiplies its input window in time order.
        self.phases = np.ascontiguousarray(phases[:, ::-1], dtype=np.float32)
        self.first = (self.taps - 1) * self.up + self.delay  # a new stream's position

    def valid(self, position: int) -> bool:
        """Whether `position` is one this resampler can leave between blocks."""
        low = (self.taps - 1) * self.up
        return low <= position <= max(self.first, low + self.down - 1)

    def start(self) -> tuple[np.ndarray, int]:
        """(history, position) of a new stream: silence before its first sample."""
        return np.zeros(self.taps - 1, dtype=np.float32), self.first

    def __call__(self, x: np.ndarray, history: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray, int]:
        """The outputs that `x` completes, and the stream's next (history, position)."""
        b = np.concatenate([history, np.asarray(x, dtype=np.float32)])
        n_out = max(0, -(-(len(b) * self.up - position) // self.down))
        out = np.empty(n_out, dtype=np.float32)
        span = np.arange(self.taps)
        for s in range(0, n_out, BLOCK):
            pos = position + self.down * np.arange(s, min(n_out, s + BLOCK))
            first = pos // self.up - (self.taps - 1)
            out[s : s + len(pos)] = np.einsum("ij,ij->i", b[first[:, None] + span], self.phases[pos % self.up])
        return out, b[len(x) :], position + n_out * self.down - len(x) * self.up

    def flush(self, history: np.ndarray, position: int, n_in: int, n_out: int) -> np.ndarray:
        """What a finished stream of `n_in` samples, `n_out` of them put out, still owes: the
        outputs the filter's delay held back (silence after its end)."""
        out, _, _ = self(np.zeros(self.delay // self.up + 1, dtype=np.float32), history, position)
        return out[: max(0, -(-n_in * self.up // self.down) - n_out)]
