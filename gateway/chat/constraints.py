"""What a chat request's output must follow: a GBNF grammar or a JSON schema, from
`grammar_string`, `grammar_path`, `response_format`, `enable_json` or a forced tool call.

The worker turns a schema into GBNF with llama.cpp's own converter and compiles the
grammar; its refusals come back as 400s with the parser's message. Both are bounded here first
(`protocol.grammar_bounds`), since llama.cpp crashes on a grammar nested deep enough.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gateway.errors import BadRequest
from protocol.chat import ChatRequest, Tool
from protocol.grammar_bounds import MAX_GRAMMAR_BYTES, TooBig, check_gbnf, check_schema
from protocol.wire import Constraint

ANY_OBJECT = '{"type": "object"}'


def read_grammar(path: str, allowed: list[Path]) -> str:
    """The GBNF file at `path`, which must resolve (symlinks followed) inside an allowed folder.

    A relative path is taken relative to each allowed folder in turn.
    """
    if not allowed:
        raise BadRequest("`grammar_path`: this server allows no grammar files (start it with --grammar-dir DIR)")
    if "\x00" in path or not path:
        raise BadRequest("`grammar_path`: not a valid path")
    roots = [os.path.realpath(d) for d in allowed]
    candidates = [path] if os.path.isabs(path) else [os.path.join(r, path) for r in roots]
    for candidate in candidates:
        real = os.path.realpath(candidate)
        if not any(os.path.commonpath([real, r]) == r for r in roots):
            continue  # outside every allowed folder, whatever the spelling (.., symlinks)
        if not os.path.isfile(real):
            continue
        if os.path.getsize(real) > MAX_GRAMMAR_BYTES:
            raise BadRequest(f"`grammar_path`: the file is larger than {MAX_GRAMMAR_BYTES} bytes")
        try:
            with open(real, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadRequest(f"`grammar_path`: cannot read the file: {exc.__class__.__name__}") from None
    # One answer for "outside" and "missing": the reply must not reveal what exists elsewhere.
    raise BadRequest("`grammar_path`: no such grammar file in the folders this server allows")


def bounded_schema(schema: Any, field: str) -> Any:
    try:
        check_schema(schema)
    except TooBig as exc:
        raise BadRequest(f"`{field}`: {exc}") from None
    return schema


def bounded_grammar(text: str, field: str) -> str:
    try:
        check_gbnf(text)
    except TooBig as exc:
        raise BadRequest(f"`{field}`: {exc}") from None
    return text


def check_tools(tools: list[Tool] | None) -> None:
    """Every tool's parameters, whether or not a grammar is made of them: the chat template renders them too."""
    for i, t in enumerate(tools or []):
        if t.function.parameters is not None:
            bounded_schema(t.function.parameters, f"tools[{i}].function.parameters")


def forced_tool_schema(tools: list[Tool], name: str | None) -> str:
    """A schema for exactly one call `{"name": ..., "arguments": {...}}` to `name`, or to any tool.

    `name` comes first in the grammar, so a streaming client sees the function name
    before its arguments.
    """
    chosen = [t for t in tools if name is None or t.function.name == name]
    options: list[dict[str, Any]] = []
    for t in chosen:
        params = t.function.parameters or {"type": "object"}
        options.append({
            "type": "object",
            "properties": {"name": {"const": t.function.name}, "arguments": params},
            "required": ["name", "arguments"],
        })  # fmt: skip
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return json.dumps(schema)


def tool_mode(req: ChatRequest) -> tuple[str, str | None]:
    """("none" | "auto" | "required", forced function name or None)."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise BadRequest("`tool_choice`: only allowed when `tools` are given")
        return "none", None
    if choice is None or choice == "auto":
        return "auto", None
    if choice in ("none", "required"):
        return str(choice), None
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise BadRequest('`tool_choice`: expected {"type": "function", "function": {"name": ...}}')
        if name not in {t.function.name for t in req.tools}:
            raise BadRequest(f"`tool_choice`: no tool named {name!r} in `tools`")
        return "required", name
    raise BadRequest("`tool_choice`: expected 'none', 'auto', 'required' or a function")


def _response_format_schema(rf: dict[str, Any]) -> str | None:
    kind = rf.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return ANY_OBJECT
    if kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise BadRequest("`response_format.json_schema.schema`: a JSON schema object is required")
        return json.dumps(bounded_schema(schema, "response_format.json_schema.schema"))
    raise BadRequest(f"`response_format.type`: expected text, json_object or json_schema, not {kind!r}")


def constraint_of(req: ChatRequest, grammar_dirs: list[Path], tools: str, forced: str | None) -> Constraint | None:
    """The one constraint of this request; asking for two at once is a 400."""
    found: list[tuple[str, Constraint]] = []
    if req.grammar_string is not None:
        if not req.grammar_string.strip():
            raise BadRequest("`grammar_string`: the grammar is empty")
        found.append(("grammar_string", Constraint("gbnf", bounded_grammar(req.grammar_string, "grammar_string"),
                                                   "grammar_string")))  # fmt: skip
    if req.grammar_path is not None:
        text = bounded_grammar(read_grammar(req.grammar_path, grammar_dirs), "grammar_path")
        found.append(("grammar_path", Constraint("gbnf", text, "grammar_path")))
    if req.response_format is not None and (schema := _response_format_schema(req.response_format)):
        found.append(("response_format", Constraint("json_schema", schema, "response_format")))
    if req.enable_json:
        found.append(("enable_json", Constraint("json_schema", ANY_OBJECT, "enable_json")))
    if tools == "required":
        assert req.tools is not None
        found.append(("tool_choice", Constraint("json_schema", forced_tool_schema(req.tools, forced), "tools")))
    if len({(c.kind, c.text) for _, c in found}) > 1:  # `enable_json` with `response_format` json_object is one ask
        names = ", ".join(f"`{n}`" for n, _ in found)
        raise BadRequest(f"{names}: only one output constraint per request")
    return found[0][1] if found else None
