"""How big a grammar or a JSON schema may be before it reaches llama.cpp.

llama.cpp's GBNF parser recurses once per nested group and expands a repetition `x{m,n}` into
n rules, and its JSON-schema converter writes `maxLength: n` as n nested optional groups. Measured
on this project's worker (8 MiB main-thread stack): 5,000 nested groups parsed, 20,000 killed the
worker with SIGSEGV, and so did a schema with `maxLength: 100000`; `maxLength: 10**9` made the
converter build gigabytes of text. The gateway checks what a request sends (so a bad one is a 400
before any worker sees it) and the worker checks the grammar a schema turns into, the one that is
compiled. The bounds leave ordinary grammars and schemas far inside them.
"""

from __future__ import annotations

import re
from typing import Any

MAX_GRAMMAR_BYTES = 1 << 20
MAX_NESTING = 2000  # groups inside groups; a schema's maxLength of MAX_REPEAT nests that deep
MAX_REPEAT = 1000  # one repetition's count, and a schema's maxLength/maxItems and friends
MAX_TOTAL_REPEAT = 100_000  # all repetitions of one grammar together (each makes that many rules)
MAX_SCHEMA_DEPTH = 128  # JSON levels: an object schema inside `properties` is two
MAX_SCHEMA_NODES = 20_000
MAX_PATTERN_CHARS = 4096

_COUNT_KEYS = frozenset({"maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties",
                         "maxContains", "minContains"})  # fmt: skip
_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


class TooBig(ValueError):
    """A grammar or schema past a bound; the message says which, for a 400."""


def check_gbnf(text: str) -> None:
    """Size, nesting and repetition counts of GBNF text; TooBig if any is past its bound."""
    if len(text.encode()) > MAX_GRAMMAR_BYTES:
        raise TooBig(f"the grammar is larger than {MAX_GRAMMAR_BYTES} bytes")
    depth = deepest = total = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "[":  # a literal or a character class: skip it, escapes included
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and text[i] != close:
                i += 2 if text[i] == "\\" else 1
        elif c == "#":
            while i < n and text[i] not in "\r\n":
                i += 1
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth -= 1
        elif c == "{":
            m = _REPEAT.match(text, i)
            if m is not None:
                count = max(int(m.group(1)), int(m.group(2) or 0))
                if count > MAX_REPEAT:
                    raise TooBig(f"a repetition of {count} is more than {MAX_REPEAT}")
                total += count
                i = m.end() - 1
        i += 1
    if deepest > MAX_NESTING:
        raise TooBig(f"the grammar nests groups {deepest} deep, more than {MAX_NESTING}")
    if total > MAX_TOTAL_REPEAT:
        raise TooBig(f"the grammar's repetitions add up to {total}, more than {MAX_TOTAL_REPEAT}")


def check_schema(schema: Any) -> None:
    """Depth, size, repetition keywords and patterns of a JSON schema; TooBig if any is past its bound."""
    nodes = 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:  # iterative: the schema's depth is what is being checked
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise TooBig(f"the schema has more than {MAX_SCHEMA_NODES} parts")
        if depth > MAX_SCHEMA_DEPTH:
            raise TooBig(f"the schema nests more than {MAX_SCHEMA_DEPTH} deep")
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _COUNT_KEYS and isinstance(value, (int, float)) and value > MAX_REPEAT:
                    raise TooBig(f"`{key}` of {value} is more than {MAX_REPEAT}")
                if key == "pattern" and isinstance(value, str):
                    _check_pattern(value)
                stack.append((value, depth + 1))
        elif isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)


def _check_pattern(pattern: str) -> None:
    if len(pattern) > MAX_PATTERN_CHARS:
        raise TooBig(f"a `pattern` is longer than {MAX_PATTERN_CHARS} characters")
    for m in _REPEAT.finditer(pattern):
        count = max(int(m.group(1)), int(m.group(2) or 0))
        if count > MAX_REPEAT:
            raise TooBig(f"a `pattern` repeats {count} times, more than {MAX_REPEAT}")
