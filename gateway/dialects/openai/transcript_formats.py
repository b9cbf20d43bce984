"""A worker's Transcript in the response formats of /v1/audio/transcriptions: text, json,
verbose_json, and the subtitle formats SubRip (srt) and WebVTT (vtt).

Subtitle cues must be well formed for a player: each cue ends no earlier than it starts, cues
start in order, and no time lies past the audio's end. Whisper's timestamps nearly always are
(they come from its timestamp tokens, per 30-second window), and these functions make them so
when they are not, rather than hand a player a cue that runs backwards.
"""

from __future__ import annotations

from typing import NamedTuple

from protocol.languages import WHISPER_LANGUAGES
from protocol.transcriptions import DurationUsage, Segment, Transcription, TranscriptionVerbose, Word
from protocol.wire import Transcript


class Cue(NamedTuple):
    start: float
    end: float
    text: str


def text_of(t: Transcript) -> str:
    """The whole transcript: the segments' text joined (each begins with its own space)."""
    return "".join(s.text for s in t.segments).strip()


def cues(t: Transcript) -> list[Cue]:
    """One cue per segment with text, times clamped into [0, duration] and made monotonic."""
    out: list[Cue] = []
    limit = max(t.duration, 0.0)
    floor = 0.0
    for s in t.segments:
        text = s.text.strip()
        if not text:
            continue
        start = min(max(s.start, floor), limit)
        end = min(max(s.end, start), limit)
        out.append(Cue(start, end, text))
        floor = start
    return out


def timestamp(seconds: float, separator: str) -> str:
    """HH:MM:SS<separator>mmm, rounded to the millisecond (SubRip uses ',', WebVTT '.')."""
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{ms:03d}"


def srt(t: Transcript) -> str:
    blocks = [f"{i}\n{timestamp(c.start, ',')} --> {timestamp(c.end, ',')}\n{_one_block(c.text)}\n"
              for i, c in enumerate(cues(t), start=1)]  # fmt: skip
    return "\n".join(blocks)


def vtt(t: Transcript) -> str:
    blocks = [f"{timestamp(c.start, '.')} --> {timestamp(c.end, '.')}\n{_one_block(c.text)}\n" for c in cues(t)]
    return "\n".join(["WEBVTT\n", *blocks])


def _one_block(text: str) -> str:
    """A cue's text without blank lines, which would end the cue early in both formats (and a
    `-->` in WebVTT would read as a timing line)."""
    lines = [line.strip() for line in text.replace("-->", "->").splitlines()]
    return "\n".join(line for line in lines if line)


def usage(t: Transcript) -> DurationUsage:
    return DurationUsage(seconds=round(t.duration, 3))


def as_json(t: Transcript) -> Transcription:
    return Transcription(text=text_of(t), usage=usage(t))


def as_verbose(t: Transcript, words: bool) -> TranscriptionVerbose:
    segments = [Segment(id=s.id, seek=s.seek, start=round(s.start, 3), end=round(s.end, 3), text=s.text,
                        tokens=s.tokens, temperature=s.temperature, avg_logprob=s.avg_logprob,
                        compression_ratio=s.compression_ratio, no_speech_prob=s.no_speech_prob)
                for s in t.segments]  # fmt: skip
    return TranscriptionVerbose(
        task="transcribe",
        language=WHISPER_LANGUAGES.get(t.language, t.language),
        duration=round(t.duration, 3),
        text=text_of(t),
        segments=segments,
        usage=usage(t),
        words=[Word(w.word.strip(), round(w.start, 3), round(w.end, 3)) for w in t.words] if words else None,
    )
