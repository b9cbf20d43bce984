"""Text to a Piper voice's phoneme ids: sentences and clauses, espeak-ng's IPA, the voice's id map.

Piper voices were trained on espeak-ng's IPA phonemes, clause by clause, with the clause's
punctuation put back after its phonemes; each sentence is one pass of the model. The ids are:
BOS `^`, pad `_`, then each phoneme character's id followed by a pad, then EOS `$`
(every symbol looked up in the voice's `.onnx.json` `phoneme_id_map`).

espeak-ng is GPL-licensed, so it runs as a separate program (`espeak-ng -q --ipa --stdin`), never
linked in. Its command line prints one line of IPA per clause but not the punctuation that ended
the clause, which Piper's phonemizer (linked to the library) reads from espeak's clause
terminator. So this module splits the text into clauses itself, where espeak does (a clause
mark followed by a space; a period before a lowercase word is not an end, as espeak's English
rule has it; an ellipsis ends a clause even without a space; a blank line ends a paragraph),
hands espeak one sentence at a time with each clause as its own paragraph, and appends the
mark Piper would: `.` `?` `!` as they are, `,` `:` `;` with a space, `;` and a space for a
dash (espeak counts a dash as a semicolon), nothing for an ellipsis or a paragraph end (one
deviation: a space after a clause without a mark inside a sentence, "one... two", where Piper
runs the two clauses' phonemes together as one word). If
espeak still splits a clause further (a clause of a few hundred words), its lines for that
clause are joined with spaces.

Sentences longer than MAX_SENTENCE_CHARS are cut at clause ends, then at spaces, so one pass of
the model stays bounded whatever the input.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

BOS, EOS, PAD = "^", "$", "_"
MAX_SENTENCE_CHARS = 400  # characters of text per model pass
ESPEAK_TIMEOUT_S = 30.0
ESPEAK_MISSING = (
    "the espeak-ng program is not installed, and text to speech needs it for phonemes: "
    "install it with `apt-get install espeak-ng` (Debian/Ubuntu)"
)

# Closing quotes and brackets may follow a clause's mark before the space.
_CLOSE = "\"'”’»)\\]"
_END = re.compile(
    rf"""(?P<ellipsis>\.{{3,}}|…)[{_CLOSE}]*        # an ellipsis ends a clause, space after it or not
       | (?P<mark>[.?!]+|[,:;]|[–—])[{_CLOSE}]*(?=\s|\Z)  # a mark followed by a space (or the end)
       | (?P<para>\n[^\S\n]*\n\s*)                   # a blank line: a paragraph ends
    """,
    re.VERBOSE,
)
_SPACE_AFTER = {",", ":", ";"}
_LANGUAGE_FLAG = re.compile(r"\([^)]*\)")  # espeak's "(fr)" ... "(en)" around foreign words
_VOICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_+/-]*$")


@dataclass(frozen=True, slots=True)
class Clause:
    """A clause as espeak reads it (`text`, its mark included), the mark Piper appends after its
    phonemes (`mark`: one of . ? ! , : ; or ""), and whether a sentence ends with it."""

    text: str
    mark: str = ""
    sentence_end: bool = False


def clean(text: str) -> str:
    """Control characters (but newlines) become spaces: espeak reads plain text, and a NUL would cut it."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return "".join(" " if unicodedata.category(c) == "Cc" and c != "\n" else c for c in text)


def _speakable(piece: str) -> bool:
    """Anything but punctuation and spaces (letters, digits, symbols such as $ or %)."""
    return any(unicodedata.category(c)[0] in "LNS" for c in piece)


def split_clauses(text: str) -> list[Clause]:
    """The clauses of `text`, in order, where espeak-ng ends them; those with nothing to say
    (only punctuation) are dropped."""
    text = clean(text)
    clauses: list[Clause] = []
    start = pos = 0
    while (m := _END.search(text, pos)) is not None:
        pos = m.end()
        if m["mark"] is not None and m["mark"][0] == "." and len(m["mark"]) == 1:
            following = text[m.end() :].lstrip()
            if following[:1].islower():  # "e.g. this", "a.m. was": not the end of a sentence
                continue
        if m["ellipsis"] is not None:
            mark, end = "", False
        elif m["para"] is not None:
            mark, end = "", True
        else:
            first = m["mark"][0]
            mark = ";" if first in "–—" else first
            end = first in ".?!"
        piece = text[start : m.start() if m["para"] is not None else m.end()].strip()
        start = m.end()
        if _speakable(piece):
            clauses.append(Clause(piece, mark, end))
        elif end and clauses and not clauses[-1].sentence_end:
            clauses[-1] = Clause(clauses[-1].text, clauses[-1].mark, True)
    tail = text[start:].strip()
    if _speakable(tail):
        clauses.append(Clause(tail, "", True))
    if clauses and not clauses[-1].sentence_end:
        clauses[-1] = Clause(clauses[-1].text, clauses[-1].mark, True)
    return clauses


def _cut(clause: Clause, limit: int) -> list[Clause]:
    """A clause longer than `limit` characters, cut at spaces (or anywhere, for a longer word);
    only the last piece keeps the clause's mark."""
    pieces: list[str] = []
    rest = clause.text
    while len(rest) > limit:
        at = rest.rfind(" ", 0, limit + 1)
        at = at if at > 0 else limit
        pieces.append(rest[:at].strip())
        rest = rest[at:].strip()
    pieces.append(rest)
    out = [Clause(p, "", True) for p in pieces if p]
    out[-1] = Clause(out[-1].text, clause.mark, True)
    return out


def split_sentences(text: str, limit: int = MAX_SENTENCE_CHARS) -> list[list[Clause]]:
    """The sentences of `text`, each a list of clauses of at most `limit` characters in all: a
    longer sentence is cut at its clause ends, and a longer clause at spaces."""
    sentences: list[list[Clause]] = []
    current: list[Clause] = []
    size = 0
    for clause in split_clauses(text):
        if len(clause.text) > limit:
            if current:
                sentences.append(current)
                current, size = [], 0
            sentences.extend([piece] for piece in _cut(clause, limit))
            continue
        if current and size + len(clause.text) > limit:
            sentences.append(current)
            current, size = [], 0
        current.append(clause)
        size += len(clause.text) + 1
        if clause.sentence_end:
            sentences.append(current)
            current, size = [], 0
    if current:
        sentences.append(current)
    return sentences


def sentence_phonemes(clauses: Sequence[Clause], lines: Sequence[str]) -> str:
    """One sentence's phonemes as Piper builds them: each clause's IPA (decomposed to NFD, language
    switch flags removed), then its mark, with a space after , : ;"""
    parts = []
    for i, (clause, line) in enumerate(zip(clauses, lines)):
        parts.append(unicodedata.normalize("NFD", _LANGUAGE_FLAG.sub("", line)))
        if clause.mark:
            parts.append(clause.mark + (" " if clause.mark in _SPACE_AFTER else ""))
        elif i < len(clauses) - 1:
            parts.append(" ")  # (Piper adds nothing here, running the words together)
    return "".join(parts)


def phoneme_ids(phonemes: str, id_map: Mapping[str, Sequence[int]],
                phoneme_map: Mapping[str, Sequence[str]] | None = None) -> tuple[list[int], int]:  # fmt: skip
    """(ids, how many phonemes the voice has no id for, which are left out, as Piper does)."""
    ids = [*id_map[BOS], *id_map[PAD]]
    pad = list(id_map[PAD])
    missing = 0
    for char in phonemes:
        for phoneme in phoneme_map.get(char, (char,)) if phoneme_map else (char,):
            mapped = id_map.get(phoneme)
            if mapped is None:
                missing += 1
                continue
            ids.extend(mapped)
            ids.extend(pad)
    ids.extend(id_map[EOS])
    return ids, missing


class PhonemizerError(Exception):
    """espeak-ng is missing or failed."""


class Espeak:
    """The espeak-ng program, for one voice (e.g. "en-us"): text in on stdin, IPA out, a line per clause."""

    def __init__(self, voice: str, program: str = "espeak-ng") -> None:
        if not _VOICE_NAME.match(voice):
            raise PhonemizerError(f"espeak voice {voice!r} is not a voice name")
        found = shutil.which(program)
        if found is None:
            raise PhonemizerError(ESPEAK_MISSING)
        self.program = found
        self.voice = voice

    def lines(self, text: str) -> list[str]:
        """espeak-ng's IPA for `text`, one string per clause it found."""
        # -q: no audio; --ipa: plain IPA (no tie or separator characters), as Piper's
        # espeakPHONEMES_IPA gives; -b 1: the input is UTF-8; --stdin: read it all at once.
        argv = [self.program, "-q", "--ipa", "-b", "1", "-v", self.voice, "--stdin"]
        try:
            done = subprocess.run(argv, input=text.encode(), capture_output=True, timeout=ESPEAK_TIMEOUT_S,
                                  check=False)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PhonemizerError(f"espeak-ng failed: {exc}") from None
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip()[:300]
            raise PhonemizerError(f"espeak-ng exited with status {done.returncode}: {err}")
        return [line.strip() for line in done.stdout.decode(errors="replace").splitlines()]

    def clause_lines(self, clauses: Sequence[Clause]) -> list[str]:
        """One IPA string per clause. The clauses go in as paragraphs of one call, so espeak
        ends a clause at least where they do; where it made more lines than clauses, each
        clause is read on its own and its lines joined."""
        # Blank lines are clauses with nothing to say (a closing quote after a full stop).
        lines = [line for line in self.lines("\n\n".join(c.text for c in clauses)) if line]
        if len(lines) == len(clauses):
            return lines
        return [" ".join(line for line in self.lines(c.text) if line) for c in clauses]
