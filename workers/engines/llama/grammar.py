"""Grammar-constrained sampling: GBNF text or a JSON schema, as a native llama.cpp sampler."""

from __future__ import annotations

import contextlib
import ctypes
import os
import tempfile
from collections.abc import Callable, Iterator

import llama_cpp as L
from llama_cpp.llama_grammar import json_schema_to_gbnf

from protocol.grammar_bounds import TooBig, check_gbnf
from protocol.wire import Constraint
from workers.engines import EngineError

MAX_MESSAGE = 2000
MAX_DETAIL = 300  # of the parser's first line


def grammar_sampler(vocab: ctypes.c_void_p, constraint: Constraint) -> ctypes.c_void_p:
    """A grammar sampler for `constraint`; EngineError(400) with the parser's own words if it is invalid."""
    field = constraint.field or ("grammar_string" if constraint.kind == "gbnf" else "response_format")
    text = constraint.text if constraint.kind == "gbnf" else schema_to_gbnf(constraint.text, field)
    if not text.strip():
        raise EngineError(f"`{field}`: the grammar is empty")
    try:
        check_gbnf(text)  # what a schema turned into, too: llama.cpp's parser crashes past these bounds
    except TooBig as exc:
        raise EngineError(f"`{field}`: {exc}") from None
    with _stderr_captured() as captured:
        sampler = L.llama_sampler_init_grammar(vocab, text.encode(), b"root")
    if not sampler:
        # llama.cpp's parser explains itself on stderr only; its log just says "failed". Its first
        # line names the error and quotes the grammar from there to the end of that line; the
        # rest would echo the grammar (a `grammar_path` file's contents), so it is left out.
        detail = next((line.strip() for line in captured() if line.strip()), "llama.cpp refused the grammar")
        raise EngineError(f"`{field}`: invalid grammar: {detail[:MAX_DETAIL]}")
    return sampler


def schema_to_gbnf(schema_json: str, field: str = "response_format") -> str:
    """llama.cpp's JSON-schema-to-GBNF converter; its refusals become 400s naming `field`."""
    try:
        return json_schema_to_gbnf(schema_json)
    except Exception as exc:
        raise EngineError(f"`{field}`: cannot turn this schema into a grammar: {exc}"[:MAX_MESSAGE]) from exc


@contextlib.contextmanager
def _stderr_captured() -> Iterator[Callable[[], list[str]]]:
    """Point fd 2 at a temporary file for the duration (the worker's loop is single-threaded)."""
    lines: list[str] = []
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            yield lambda: lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read(64 * 1024).decode(errors="replace").splitlines())
