import json
import os
from pathlib import Path

import msgspec
import pytest

from gateway.chat.constraints import (
    constraint_of,
    forced_tool_schema,
    read_grammar,
    tool_mode,
)
from gateway.errors import BadRequest
from protocol.chat import ChatRequest
from protocol.wire import Constraint

TOOLS = [
    {
        "type": "function",
        "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
    },
    {"type": "function", "function": {"name": "b"}},
]


def req(**kw: object) -> ChatRequest:
    return msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}, ChatRequest)


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    (allowed / "sub").mkdir(parents=True)
    outside.mkdir()
    (allowed / "g.gbnf").write_text('root ::= "a"')
    (allowed / "sub" / "h.gbnf").write_text('root ::= "h"')
    (outside / "s.gbnf").write_text("secret")
    os.symlink(outside / "s.gbnf", allowed / "link.gbnf")
    os.symlink(outside, allowed / "dirlink")
    return allowed, outside


def test_read_grammar_inside(dirs: tuple[Path, Path]) -> None:
    allowed, _ = dirs
    assert read_grammar("g.gbnf", [allowed]) == 'root ::= "a"'
    assert read_grammar("sub/h.gbnf", [allowed]) == 'root ::= "h"'
    assert read_grammar(str(allowed / "g.gbnf"), [allowed]) == 'root ::= "a"'
    assert read_grammar("sub/../g.gbnf", [allowed]) == 'root ::= "a"'  # stays inside: fine


@pytest.mark.parametrize(
    "path", ["../outside/s.gbnf", "link.gbnf", "dirlink/s.gbnf", "/etc/passwd", "sub", "", "nul\x00l"]
)
def test_read_grammar_refuses_everything_else(dirs: tuple[Path, Path], path: str) -> None:
    allowed, outside = dirs
    with pytest.raises(BadRequest, match="grammar_path"):
        read_grammar(path, [allowed])
    with pytest.raises(BadRequest, match="grammar_path"):
        read_grammar(str(outside / "s.gbnf"), [allowed])


def test_no_folder_no_grammar_files(dirs: tuple[Path, Path]) -> None:
    with pytest.raises(BadRequest, match="--grammar-dir"):
        read_grammar(str(dirs[0] / "g.gbnf"), [])


def test_tool_modes() -> None:
    assert tool_mode(req()) == ("none", None)
    assert tool_mode(req(tools=TOOLS)) == ("auto", None)
    assert tool_mode(req(tools=TOOLS, tool_choice="required")) == ("required", None)
    assert tool_mode(req(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "b"}})) == ("required", "b")
    for bad in ({"type": "function", "function": {"name": "zz"}}, "maybe", {"type": "x"}):
        with pytest.raises(BadRequest, match="tool_choice"):
            tool_mode(req(tools=TOOLS, tool_choice=bad))
    with pytest.raises(BadRequest, match="only allowed when"):
        tool_mode(req(tool_choice="auto"))


def test_forced_schema_puts_the_name_first() -> None:
    r = req(tools=TOOLS)
    one = json.loads(forced_tool_schema(r.tools, "a"))
    assert list(one["properties"]) == ["name", "arguments"] and one["properties"]["name"] == {"const": "a"}
    both = json.loads(forced_tool_schema(r.tools, None))
    assert [o["properties"]["name"]["const"] for o in both["anyOf"]] == ["a", "b"]
    assert both["anyOf"][1]["properties"]["arguments"] == {"type": "object"}


def test_constraints() -> None:
    assert constraint_of(req(), [], "none", None) is None
    assert constraint_of(req(response_format={"type": "text"}), [], "none", None) is None
    assert constraint_of(
        req(enable_json=True, response_format={"type": "json_object"}), [], "none", None
    ) == Constraint("json_schema", '{"type": "object"}', "response_format")
    assert constraint_of(req(grammar_string="root ::= x"), [], "none", None) == Constraint(
        "gbnf", "root ::= x", "grammar_string"
    )
    with pytest.raises(BadRequest, match="only one"):
        constraint_of(req(grammar_string="root ::= x", enable_json=True), [], "none", None)
    with pytest.raises(BadRequest, match="empty"):
        constraint_of(req(grammar_string="  "), [], "none", None)
    with pytest.raises(BadRequest, match=r"response_format\.type"):
        constraint_of(req(response_format={"type": "yaml"}), [], "none", None)
