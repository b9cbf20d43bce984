"""Finds tool calls in a model's output, while it streams and once it is complete.

The model's chat template is not known here, so the format is read off the output itself:

- Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, after optional prose;
- Llama 3.x: `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`, several joined by `;`;
- Mistral: `[TOOL_CALLS][{...}, {...}]` and `[TOOL_CALLS]name[ARGS]{...}` (optionally `[CALL_ID]id`);
- plain JSON: an answer that is a call object or an array of them, optionally in a ```json fence,
  and the OpenAI nesting `{"type": "function", "function": {"name": ..., "arguments": ...}}`.

A JSON call is recognised where a call can begin: the start of the answer, right after a call, or right
after one of the markers. A `{` elsewhere in prose is prose.

Streaming is the one implementation: `parse_tool_calls` feeds the whole text to a `ToolCallStream`. The
stream reads one character at a time and every decision depends only on the text read so far, never on
where the pieces were cut, so any split of the same text yields the same content and calls. Text that may
still turn out to be markup is held back and, once it is known not to be, released as content unchanged.

Rules worth knowing:
- a call is committed (CallStart emitted) as soon as its name is read and accepted; the arguments then
  stream raw, exactly as the model writes them. Text that breaks the JSON after that point ends the call
  (with the arguments read so far, "{}" if none) and is handled as ordinary text;
- `arguments` given as a JSON string is decoded, and so released only once the string is complete;
- whitespace, `;`, a closing fence and end-of-call markup (`</tool_call>`, `<|eom_id|>`, ...) between and
  after calls are dropped; whitespace just before a call marker is dropped too;
- with `tool_names`, only those names make calls; without, any identifier-like name does
  (so that `{"name": "Ada Lovelace", ...}` stays content).
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int  # 0, 1, 2... within the answer
    name: str


@dataclass(frozen=True)
class ArgsDelta:
    index: int
    text: str  # a fragment of that call's `arguments` JSON text


Event = ContentDelta | CallStart | ArgsDelta


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI's function.arguments


_WS = frozenset(" \t\r\n")
_VALUE_START = frozenset('{["-0123456789tfn')
_SCALAR = frozenset(string.ascii_letters + string.digits + "+-.")
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_-.")
_ID_CHARS = frozenset(string.ascii_letters + string.digits + "_-")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")

_TOOL_CALL = "<tool_call>"
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL = "[TOOL_CALLS]"
_FENCE = "```"
_MISTRAL_TAGS = ("[ARGS]", "[CALL_ID]")
# The call marker of each syntax a chat template may teach (the worker reports which, in Ready).
FORMAT_OPENERS = {"hermes": (_TOOL_CALL,), "llama3": (_PYTHON_TAG,), "mistral": (_MISTRAL,)}
# Markup a model prints after a call; only dropped right after one.
_CLOSERS = frozenset(("</tool_call>", "<|eom_id|>", "<|eot_id|>", "</s>", ";"))


def _prefixes(marks: Collection[str]) -> frozenset[str]:
    return frozenset(m[:k] for m in marks for k in range(1, len(m) + 1))


class _Markup:
    """The markers one parser looks for: its format's call marker (every format's when the
    format is unknown), code fences, and what may close a call."""

    def __init__(self, openers: Collection[str]) -> None:
        self.openers = frozenset(openers)
        self.start_marks = self.openers | {_FENCE}
        self.after_marks = self.start_marks | _CLOSERS
        self.prose_prefixes = _prefixes(self.openers)
        self.start_prefixes = _prefixes(self.start_marks)
        self.after_prefixes = _prefixes(self.after_marks)


_ANY_FORMAT = _Markup((_TOOL_CALL, _PYTHON_TAG, _MISTRAL))
_MARKUP = {name: _Markup(openers) for name, openers in FORMAT_OPENERS.items()}
# Prose runs up to the next character that might begin a marker (or be whitespace before one).
_PROSE_STOP = re.compile(r"[ \t\r\n<\[]")


def _decode_string(raw: str) -> str:
    """The value of a JSON string given without its quotes; the raw text if its escapes are broken."""
    try:
        value = json.loads(f'"{raw}"')
    except ValueError:
        return raw
    return value if isinstance(value, str) else raw


class _Scan:
    """Where one JSON value ends, one character at a time: tracks strings, escapes and nesting only.

    No validation: inside arguments the model's text is passed on as written, and a splitter only needs
    to know where the value stops. O(1) per character.
    """

    __slots__ = ("depth", "done", "esc", "in_str", "scalar")

    def __init__(self, first: str) -> None:
        self.depth = 1 if first in "{[" else 0
        self.in_str = first == '"'
        self.esc = False
        self.scalar = first not in '{["'  # a number or literal: ends at the first character not its own
        self.done = False

    def push(self, c: str) -> bool:
        """False when `c` is not part of the value (it follows a number or literal)."""
        if self.scalar:
            if c in _SCALAR:
                return True
            self.done = True
            return False
        if self.in_str:
            if self.esc:
                self.esc = False
            elif c == "\\":
                self.esc = True
            elif c == '"':
                self.in_str = False
                self.done = self.depth == 0
            return True
        if c == '"':
            self.in_str = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            self.done = self.depth == 0
        return True


class _Args:
    """One `arguments` value. An object streams out raw as it grows, so its fragments concatenate to the
    final text; a string holds JSON text that can only be decoded once complete; anything else is kept
    raw, except null, which means no arguments."""

    __slots__ = ("_buf", "_out", "_raw", "_scan", "done")

    def __init__(self, first: str) -> None:
        self._scan = _Scan(first)
        self._raw = first == "{"
        self._buf: list[str] = [] if self._raw else [first]
        self._out: list[str] = [first] if self._raw else []
        self.done = False

    def push(self, c: str) -> bool:
        """False when `c` follows the value; the value is then complete."""
        if not self._scan.push(c):
            self._settle()
            return False
        (self._out if self._raw else self._buf).append(c)
        if self._scan.done:
            self._settle()
        return True

    def finish(self) -> None:
        # The output ended inside the value: a number or literal is whole as it stands, a cut string is
        # not JSON and is dropped (the call then gets "{}"), a cut object has already streamed.
        if not self.done and self._scan.scalar:
            self._settle()

    def take(self) -> str:
        out = "".join(self._out)
        self._out.clear()
        return out

    def _settle(self) -> None:
        self.done = True
        if self._raw:
            return
        text = "".join(self._buf)
        if text.startswith('"'):
            self._out.append(_decode_string(text[1:-1]))
        elif text != "null":
            self._out.append(text)


_MORE, _DONE, _BAD = 0, 1, 2  # _CallObject.push: keep going / the object closed / not a valid object
_K_KEY_OR_END, _K_KEY, _K_COLON, _K_VALUE, _K_NAME, _K_ARGS, _K_CHILD, _K_SKIP, _K_AFTER = range(9)


class _CallObject:
    """The members of one call object whose `{` was read. Reads `name`, `arguments` / `parameters` and a
    nested `function` object (whose name and arguments count as this object's); skips the others.

    Only the object's own structure is checked (keys, colons, commas): that is what tells a call from
    text that merely starts with `{` before the name commits it.
    """

    def __init__(self, root: _CallObject | None = None) -> None:
        self._root = root or self
        self._state = _K_KEY_OR_END
        self._text: list[str] = []  # raw characters of the key or name being read
        self._esc = False
        self._key = ""
        self._skip: _Scan | None = None
        self._child: _CallObject | None = None
        self.name: str | None = None  # set on the root only
        self.args: _Args | None = None  # set on the root only

    def take_args(self) -> str:
        return self.args.take() if self.args is not None else ""

    def push(self, c: str) -> int:
        state = self._state
        if state in (_K_KEY, _K_NAME):
            return self._string_char(c)
        if state == _K_ARGS:
            return self._nested(self._root.args, c)  # type: ignore[arg-type]
        if state == _K_SKIP:
            return self._nested(self._skip, c)  # type: ignore[arg-type]
        if state == _K_CHILD:
            result = self._child.push(c)  # type: ignore[union-attr]
            if result == _DONE:
                self._state = _K_AFTER
                return _MORE
            return result
        if c in _WS:
            return _MORE
        if state == _K_KEY_OR_END:  # after `{` or `,` (a trailing comma is forgiven)
            if c == '"':
                self._state = _K_KEY
                return _MORE
            return _DONE if c == "}" else _BAD
        if state == _K_COLON:
            if c != ":":
                return _BAD
            self._state = _K_VALUE
            return _MORE
        if state == _K_AFTER:
            if c == ",":
                self._state = _K_KEY_OR_END
                return _MORE
            return _DONE if c == "}" else _BAD
        return self._value_start(c)

    def _nested(self, value: _Scan | _Args, c: str) -> int:
        if value.push(c):
            if value.done:
                self._state = _K_AFTER
            return _MORE
        self._state = _K_AFTER  # `c` follows a number or literal: it is this object's
        return self.push(c)

    def _value_start(self, c: str) -> int:
        if c not in _VALUE_START:
            return _BAD
        root, key = self._root, self._key
        if key == "name" and root.name is None:
            if c != '"':
                return _BAD
            self._state = _K_NAME
        elif key in ("arguments", "parameters") and root.args is None:
            root.args = _Args(c)
            self._state = _K_ARGS
        elif key == "function" and c == "{" and self is root and root.name is None and root.args is None:
            self._child = _CallObject(root)
            self._state = _K_CHILD
        else:
            self._skip = _Scan(c)
            self._state = _K_SKIP
        return _MORE

    def _string_char(self, c: str) -> int:
        if self._esc:
            self._esc = False
        elif c == "\\":
            self._esc = True
        elif c == '"':
            text = _decode_string("".join(self._text))
            self._text.clear()
            if self._state == _K_KEY:
                self._key = text
                self._state = _K_COLON
            else:
                self._root.name = text
                self._state = _K_AFTER
            return _MORE
        self._text.append(c)
        return _MORE


# Stream modes.
_CALLPOS = "callpos"  # where a call may begin: start of the answer, or right after a call
_PROSE = "prose"
_OPENER = "opener"  # after <tool_call>, <|python_tag|> or [TOOL_CALLS]
_FENCE_OPEN = "fence"  # after an opening ```
_OBJECT = "object"
_ARRAY = "array"
_MISTRAL_HEAD = "mistral"  # [TOOL_CALLS]name[CALL_ID]id[ARGS]
_MISTRAL_ARGS = "mistral-args"
# Array positions.
_A_FIRST, _A_ELEM, _A_SEP = range(3)


class ToolCallStream:
    """Feeds on a model's output piece by piece and returns content and tool-call events as they are known."""

    def __init__(self, tool_names: Collection[str] | None = None, tool_format: str = "") -> None:
        """`tool_format`: "hermes", "llama3" or "mistral" looks for that syntax's marker (and plain
        JSON); "" for all of them."""
        self._names = None if tool_names is None else frozenset(tool_names)
        self._m = _MARKUP.get(tool_format, _ANY_FORMAT)
        self.calls: list[ToolCall] = []
        self._mode = _CALLPOS
        self._after_call = False
        self._held = ""  # read, not yet released: content if what it begins is not a call, else markup
        self._partial = ""  # a possible marker's beginning (not part of _held)
        self._opener = ""
        self._fence_ws = False
        self._fence_pending = False  # a fence opened the candidate; it becomes _in_fence on commit
        self._in_fence = False  # a fence around calls is open: the next ``` closes it
        self._obj: _CallObject | None = None
        self._in_array = False
        self._array_pos = _A_FIRST
        self._array_base = 0  # len(self.calls) when the array opened
        self._mistral_part = "name"
        self._mistral_name = ""
        self._mistral_tag = ""
        self._margs: _Args | None = None
        self._call_name: str | None = None  # the call being streamed
        self._call_args: list[str] = []
        self._events: list[Event] = []
        self._pend_index: int | None = None  # what _parts are: None nothing, -1 content, i args of call i
        self._parts: list[str] = []
        self._steps = {
            _CALLPOS: self._callpos,
            _PROSE: self._prose,
            _OPENER: self._after_opener,
            _FENCE_OPEN: self._fence,
            _OBJECT: self._object,
            _ARRAY: self._array,
            _MISTRAL_HEAD: self._mistral,
            _MISTRAL_ARGS: self._mistral_args,
        }

    def feed(self, text: str) -> list[Event]:
        i, n = 0, len(text)
        while i < n:
            if self._mode == _PROSE and not self._partial:
                m = _PROSE_STOP.search(text, i)
                j = m.start() if m else n
                if j > i:  # nothing here can begin a marker: release it at once
                    self._content(self._held + text[i:j])
                    self._held = ""
                    i = j
                    continue
            if self._steps[self._mode](text[i]):
                i += 1
        return self._take()

    def finish(self) -> list[Event]:
        mode = self._mode
        if mode == _PROSE or (mode == _CALLPOS and not self._after_call):
            self._content(self._held + self._partial)
        elif mode == _CALLPOS:
            if not any(m.startswith(self._partial) for m in _CLOSERS):
                self._content(self._partial)
        elif self._call_name is not None:  # the output was cut inside a call
            args = self._margs if mode == _MISTRAL_ARGS else self._obj.args if self._obj else None
            if args is not None:
                args.finish()
                self._put_args(args.take())
            self._end_call()
        elif not (mode == _ARRAY and len(self.calls) > self._array_base):
            self._content(self._held)  # a candidate that never became a call
        self._held = self._partial = ""
        self._mode = _CALLPOS
        self._after_call = True
        return self._take()

    # -- one character per mode; False: not consumed, read it again in the new mode --

    def _prose(self, c: str) -> bool:
        p = self._partial + c
        if p in self._m.prose_prefixes:
            self._partial = p
            if p in self._m.openers:
                self._partial = ""
                self._open(p)
            return True
        if self._partial:  # no marker begins inside a marker, so only `c` needs a second look
            self._content(self._held + self._partial)
            self._held = self._partial = ""
            return False
        if c in _WS:
            self._held += c  # dropped if a marker follows
        else:
            self._content(self._held + c)
            self._held = ""
        return True

    def _callpos(self, c: str) -> bool:
        after = self._after_call
        p = self._partial + c
        m = self._m
        if p in (m.after_prefixes if after else m.start_prefixes):
            self._partial = p
            if p in (m.after_marks if after else m.start_marks):
                self._partial = ""
                self._mark(p)
            return True
        if self._partial == "[":  # a `[` that does not go on as [TOOL_CALLS]: a JSON array of calls
            self._partial = ""
            self._held += "["
            self._begin_array()
            return False
        if not self._partial:
            if c in _WS:
                if not after:  # leading whitespace is content unless a call follows
                    self._held += c
                return True
            if c == "{":
                self._held += c
                self._begin_object(in_array=False)
                return True
            if c == "[":  # a JSON array of calls (reached only when no marker of this format starts with `[`)
                self._held += c
                self._begin_array()
                return True
        # Prose. After a call, the whitespace and markup before it were dropped already.
        self._content(self._partial if after else self._held + self._partial)
        self._held = self._partial = ""
        self._mode = _PROSE
        return False

    def _mark(self, marker: str) -> None:
        if marker == _FENCE and self._in_fence:
            self._in_fence = False
        elif marker in _CLOSERS:
            pass
        elif marker == _FENCE:
            self._held += marker
            self._fence_ws = False
            self._mode = _FENCE_OPEN
        else:
            self._open(marker)

    def _open(self, marker: str) -> None:
        self._held += marker
        self._opener = marker
        self._mode = _OPENER

    def _after_opener(self, c: str) -> bool:
        if c in _WS:
            self._held += c
        elif c == "{":
            self._held += c
            self._begin_object(in_array=False)
        elif c == "[":
            self._held += c
            self._begin_array()
        elif self._opener == _MISTRAL and c in _NAME_CHARS:
            self._held += c
            self._mistral_name = c
            self._mistral_part = "name"
            self._mode = _MISTRAL_HEAD
        else:
            self._reject()
            return False
        return True

    def _fence(self, c: str) -> bool:
        if c in _WS:
            self._held += c
            self._fence_ws = True
        elif not self._fence_ws and (c.isalnum() or c in "_-+."):  # the language tag
            self._held += c
        elif c in "{[":
            self._held += c
            self._fence_pending = True
            if c == "{":
                self._begin_object(in_array=False)
            else:
                self._begin_array()
        else:
            self._reject()
            return False
        return True

    def _object(self, c: str) -> bool:
        obj = self._obj
        assert obj is not None
        result = obj.push(c)
        if result == _BAD:
            if self._call_name is None:
                self._reject()
            else:  # a committed call cannot be taken back: end it and read on as text
                self._put_args(obj.take_args())
                self._end_call()
                self._to_after_call()
            return False
        if self._call_name is None:
            self._held += c
            if obj.name is not None:
                if not self._accepts(obj.name):
                    self._reject()
                    return True
                self._commit(obj.name)
            elif result == _DONE:  # closed without a name: not a call
                self._reject()
                return True
            else:
                return True  # arguments read before the name wait in obj until it commits
        self._put_args(obj.take_args())
        if result == _DONE:
            self._end_call()
            if self._in_array:
                self._obj = None
                self._array_pos = _A_SEP
                self._mode = _ARRAY
            else:
                self._to_after_call()
        return True

    def _array(self, c: str) -> bool:
        pos = self._array_pos
        has_calls = len(self.calls) > self._array_base
        if c in _WS:
            self._held += c
        elif c == "{" and pos != _A_SEP:
            self._held += c
            self._begin_object(in_array=True)
        elif c == "," and pos == _A_SEP:
            self._held += c
            self._array_pos = _A_ELEM
        elif c == "]" and has_calls:
            self._to_after_call()
        elif has_calls and pos == _A_SEP:  # the array ends without its `]`
            self._to_after_call()
            return False
        else:
            self._reject()
            return False
        return True

    def _mistral(self, c: str) -> bool:
        part = self._mistral_part
        if part == "tag":
            tag = self._mistral_tag + c
            if not any(t.startswith(tag) for t in _MISTRAL_TAGS):
                self._reject()
                return False
            self._held += c
            self._mistral_tag = tag
            if tag == "[CALL_ID]":
                self._mistral_part = "id"
            elif tag == "[ARGS]":
                if not self._accepts(self._mistral_name):
                    self._reject()
                    return True
                self._commit(self._mistral_name)
                self._margs = None
                self._mode = _MISTRAL_ARGS
            return True
        if c == "[":
            self._mistral_tag = c
            self._mistral_part = "tag"
        elif part == "name" and c in _NAME_CHARS:
            self._mistral_name += c
        elif part != "id" or c not in _ID_CHARS:
            self._reject()
            return False
        self._held += c
        return True

    def _mistral_args(self, c: str) -> bool:
        args = self._margs
        if args is None:
            if c in _WS:
                return True
            if c not in _VALUE_START:  # no value: a call without arguments
                self._end_call()
                self._to_after_call()
                return False
            self._margs = _Args(c)
            self._put_args(self._margs.take())
            return True
        consumed = args.push(c)
        self._put_args(args.take())
        if args.done:
            self._end_call()
            self._to_after_call()
        return consumed

    # -- transitions --

    def _begin_object(self, *, in_array: bool) -> None:
        self._obj = _CallObject()
        self._in_array = in_array
        self._mode = _OBJECT

    def _begin_array(self) -> None:
        self._array_pos = _A_FIRST
        self._array_base = len(self.calls)
        self._mode = _ARRAY

    def _accepts(self, name: str) -> bool:
        if self._names is not None:
            return name in self._names
        return _NAME_RE.fullmatch(name) is not None

    def _commit(self, name: str) -> None:
        self._held = ""  # the markup that led here
        if self._fence_pending:
            self._in_fence = True
            self._fence_pending = False
        self._flush()
        self._events.append(CallStart(len(self.calls), name))
        self._call_name = name
        self._call_args = []

    def _end_call(self) -> None:
        assert self._call_name is not None
        if not self._call_args:
            self._put_args("{}")
        self.calls.append(ToolCall(self._call_name, "".join(self._call_args)))
        self._call_name = None

    def _to_after_call(self) -> None:
        self._held = ""
        self._obj = None
        self._margs = None
        self._in_array = False
        self._mode = _CALLPOS
        self._after_call = True

    def _reject(self) -> None:
        """What was held is not a call after all: it is content, and the text goes on as prose."""
        self._content(self._held)
        self._held = self._partial = ""
        self._fence_pending = False
        self._obj = None
        self._in_array = False
        self._mode = _PROSE

    # -- events: consecutive pieces of one kind are joined into one event per feed --

    def _content(self, text: str) -> None:
        if text:
            self._put(-1, text)

    def _put_args(self, text: str) -> None:
        if text:
            self._call_args.append(text)
            self._put(len(self.calls), text)

    def _put(self, index: int, text: str) -> None:
        if self._pend_index != index:
            self._flush()
            self._pend_index = index
        self._parts.append(text)

    def _flush(self) -> None:
        if self._parts:
            text = "".join(self._parts)
            self._parts.clear()
            index = self._pend_index
            self._events.append(ContentDelta(text) if index == -1 else ArgsDelta(index, text))  # type: ignore[arg-type]
        self._pend_index = None

    def _take(self) -> list[Event]:
        self._flush()
        events, self._events = self._events, []
        return events


def parse_tool_calls(text: str, tool_names: Collection[str] | None = None) -> tuple[str, list[ToolCall]]:
    """(content without the call markup, calls) of a complete answer; the same as streaming it."""
    stream = ToolCallStream(tool_names)
    events = stream.feed(text) + stream.finish()
    return "".join(e.text for e in events if isinstance(e, ContentDelta)), stream.calls


def arguments_object(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object the Anthropic and Ollama dialects send (`input`,
    `arguments`). Output cut short (max_tokens) or a model that wrote a non-object gives an empty
    object: both fields must be one."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
