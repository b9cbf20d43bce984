"""Splits a model's chain-of-thought from its answer, piece by piece as the output streams.

Used when `reasoning_format` is 'deepseek', 'deepseek-legacy' or 'auto' (all split the same way today;
the format is kept as a parameter in case they come to differ). With 'none' no splitter is used and
`<think>...</think>` stays inline in the content.

Two output shapes are recognised from the text itself:

- `<think>REASONING</think>CONTENT` (or `<thinking>...</thinking>`), the tag preceded by whitespace only;
  a `<think>` later in the content is content. An unclosed `<think>` makes the rest reasoning. With
  `starts_in_reasoning` (the prompt already opened `<think>`), the output starts as reasoning, and a
  `<think>` the model repeats at its start is dropped.
- gpt-oss harmony: `[<|start|>assistant]<|channel|>analysis<|message|>REASONING<|end|>` then
  `<|start|>assistant<|channel|>final<|message|>CONTENT[<|return|>|<|end|>]`. The `analysis` channel is
  reasoning, every other channel content; headers and the `<|...|>` markers are dropped, text outside
  any channel is content.

Whitespace rule (as llama-server does): the reasoning loses its leading and trailing whitespace, the
content its leading whitespace after a marker; so "<think>\\nx\\n</think>\\n\\ny" gives ("x", "y").
An output with no marker at all is content, unchanged. Several harmony messages on one side are
joined with a newline.

Only what may be the beginning of a marker (a `<` and what follows it) and whitespace that may turn out
to end the reasoning are held back; everything else is released at once. Decisions depend only on
the text read so far, so any split of the same text gives the same concatenated result.
"""

from __future__ import annotations

SPLIT_FORMATS = ("deepseek", "deepseek-legacy", "auto")

_WS = " \t\r\n"
_THINK_CLOSE = {"<think>": "</think>", "<thinking>": "</thinking>"}
_H_START, _H_CHANNEL, _H_CONSTRAIN, _H_MESSAGE = "<|start|>", "<|channel|>", "<|constrain|>", "<|message|>"
_H_ENDS = ("<|end|>", "<|return|>", "<|call|>")
_HARMONY = (_H_START, _H_CHANNEL, _H_CONSTRAIN, _H_MESSAGE, *_H_ENDS)
_START_MARKS = (*_THINK_CLOSE, *_HARMONY)

# Modes.
_START = "start"  # before anything but whitespace
_THINK = "think"  # inside <think>
_ANSWER = "answer"  # after </think>: all content, no markers
_HARMONY_MODE = "harmony"  # plain content or harmony messages
# Where text goes.
_REASONING, _CONTENT, _DROP = "reasoning", "content", "drop"


def splits_reasoning(reasoning_format: str | None) -> bool:
    """Whether this `reasoning_format` moves the chain-of-thought to reasoning_content."""
    return reasoning_format in SPLIT_FORMATS


class ReasoningSplitter:
    """Feeds on a model's output and returns the (reasoning, content) each piece releases."""

    def __init__(self, *, starts_in_reasoning: bool = False, reasoning_format: str = "deepseek") -> None:
        if reasoning_format not in SPLIT_FORMATS:
            raise ValueError(f"reasoning_format {reasoning_format!r} does not split; expected one of {SPLIT_FORMATS}")
        self.reasoning_format = reasoning_format
        self._mode = _THINK if starts_in_reasoning else _START
        self._close = "</think>"
        self._reopen = starts_in_reasoning  # a repeated <think> at the start is dropped
        self._sink = _REASONING if starts_in_reasoning else _CONTENT
        self._lead = starts_in_reasoning  # strip whitespace until the first visible character
        self._start_ws = ""  # leading whitespace: dropped before a marker, else content
        self._ws = ""  # reasoning's trailing whitespace, released if more reasoning follows
        self._partial = ""
        self._channel = ""  # the harmony channel's name, as read from its header
        self._reading_channel = False
        self._sep = ""  # a newline between two harmony messages on the same side
        self._said = {_REASONING: False, _CONTENT: False}
        self._out = {_REASONING: [], _CONTENT: []}  # type: dict[str, list[str]]

    def feed(self, text: str) -> tuple[str, str]:
        i, n = 0, len(text)
        while i < n:
            if not self._partial and self._mode != _START:
                if self._mode == _ANSWER:
                    self._plain(text[i:])
                    break
                j = text.find("<", i)  # every marker begins with `<`
                j = n if j < 0 else j
                if j > i:
                    self._plain(text[i:j])
                    i = j
                    continue
            if self._step(text[i]):
                i += 1
        return self._take()

    def finish(self) -> tuple[str, str]:
        if self._partial:  # not a marker after all
            partial, self._partial = self._partial, ""
            self._plain(partial)
        if self._mode == _START:
            self._emit(_CONTENT, self._start_ws)
            self._start_ws = ""
        self._ws = ""  # reasoning's trailing whitespace
        return self._take()

    def _step(self, c: str) -> bool:
        """Reads one character; False: it must be read again (a held marker start turned out to be text)."""
        p = self._partial + c
        marks = self._marks()
        if (c == "<" or self._partial) and any(m.startswith(p) for m in marks):
            if p in marks:
                self._partial = ""
                self._marker(p)
            else:
                self._partial = p
            return True
        if self._partial:  # no marker begins inside another's beginning: only `c` needs a second look
            partial, self._partial = self._partial, ""
            self._plain(partial)
            return False
        self._plain(c)
        return True

    def _marks(self) -> tuple[str, ...]:
        if self._mode == _START:
            return _START_MARKS
        if self._mode == _THINK:
            return (self._close, "<think>") if self._reopen and self._lead else (self._close,)
        if self._mode == _HARMONY_MODE:
            return _HARMONY
        return ()

    def _marker(self, marker: str) -> None:
        mode = self._mode
        if mode == _START and marker in _THINK_CLOSE:
            self._start_ws = ""
            self._close = _THINK_CLOSE[marker]
            self._enter(_THINK, _REASONING)
        elif mode == _THINK and marker == self._close:
            self._ws = ""
            self._enter(_ANSWER, _CONTENT)
        elif mode == _THINK:
            self._reopen = False  # the repeated opening tag
        else:
            self._start_ws = ""
            self._mode = _HARMONY_MODE
            self._harmony(marker)

    def _harmony(self, marker: str) -> None:
        self._ws = ""  # a message's end ends its reasoning's trailing whitespace too
        self._reading_channel = marker == _H_CHANNEL  # `<|constrain|>json` or `<|message|>` ends the name
        if marker == _H_CHANNEL:
            self._channel = ""
        if marker in (_H_START, _H_CHANNEL, _H_CONSTRAIN):  # header text (role, channel, recipient): dropped
            self._sink = _DROP
        elif marker == _H_MESSAGE:
            words = self._channel.split()
            self._channel = ""
            self._enter(_HARMONY_MODE, _REASONING if words and words[0] == "analysis" else _CONTENT)
        else:  # the message ended: what follows, outside any channel, is content
            self._channel = ""
            self._enter(_HARMONY_MODE, _CONTENT)

    def _enter(self, mode: str, sink: str) -> None:
        self._mode = mode
        self._sink = sink
        self._lead = True
        self._sep = "\n" if mode == _HARMONY_MODE and self._said[sink] else ""

    def _plain(self, s: str) -> None:
        """Text that is no marker, routed by where the output stands."""
        if self._mode == _START:
            if not s.strip(_WS):
                self._start_ws += s
                return
            self._mode = _HARMONY_MODE  # content, unchanged, though harmony markers may still follow
            s, self._start_ws = self._start_ws + s, ""
            self._emit(_CONTENT, s)
            return
        if self._sink == _DROP:
            if self._reading_channel:
                self._channel += s
            return
        if self._lead:
            s = s.lstrip(_WS)
            if not s:
                return
            self._lead = False
            s, self._sep = self._sep + s, ""
        if self._sink == _CONTENT:
            self._emit(_CONTENT, s)
            return
        body = s.rstrip(_WS)
        if body:
            self._emit(_REASONING, self._ws + body)
            self._ws = s[len(body) :]
        else:
            self._ws += s

    def _emit(self, sink: str, text: str) -> None:
        if text:
            self._out[sink].append(text)
            self._said[sink] = True

    def _take(self) -> tuple[str, str]:
        reasoning, content = "".join(self._out[_REASONING]), "".join(self._out[_CONTENT])
        self._out[_REASONING].clear()
        self._out[_CONTENT].clear()
        return reasoning, content


def split_reasoning(text: str, *, starts_in_reasoning: bool = False,
                    reasoning_format: str = "deepseek") -> tuple[str, str]:  # fmt: skip
    """(reasoning, content) of a complete output; the same as streaming it in any pieces."""
    splitter = ReasoningSplitter(starts_in_reasoning=starts_in_reasoning, reasoning_format=reasoning_format)
    r1, c1 = splitter.feed(text)
    r2, c2 = splitter.finish()
    return r1 + r2, c1 + c2
