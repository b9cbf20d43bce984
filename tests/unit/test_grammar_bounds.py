"""Bounds on grammars and schemas: what llama.cpp crashes on is refused, what people write is not."""

from __future__ import annotations

import pytest

from protocol.grammar_bounds import MAX_NESTING, MAX_REPEAT, TooBig, check_gbnf, check_schema


def test_ordinary_grammars_pass_and_literals_and_classes_are_not_counted() -> None:
    check_gbnf('root ::= "(" [a-z(]{1,16} ")" ws\nws ::= [ \\t\\n]* # a comment with ( and {99999}\n')
    check_gbnf('root ::= "\\"(((" x{0,' + str(MAX_REPEAT) + "}\nx ::= " + "(" * MAX_NESTING + '"a"' + ")" * MAX_NESTING)


@pytest.mark.parametrize(
    ("grammar", "says"),
    [
        ("root ::= " + "(" * (MAX_NESTING + 1) + '"a"' + ")" * (MAX_NESTING + 1), "nests groups"),
        ('root ::= "a"{0,' + str(MAX_REPEAT + 1) + "}", "repetition"),
        ('root ::= "a"{' + str(10**12) + ",}", "repetition"),
        ("root ::= " + " ".join(['"a"{0,1000}'] * 101), "add up"),
        ('root ::= "' + "a" * (1 << 20) + '"', "larger"),
    ],
)
def test_grammars_past_a_bound_are_refused_naming_it(grammar: str, says: str) -> None:
    with pytest.raises(TooBig, match=says):
        check_gbnf(grammar)


def test_schemas_are_bounded_in_depth_size_counts_and_patterns() -> None:
    check_schema({"type": "object", "properties": {"name": {"type": "string", "maxLength": 200, "pattern": "^[a-z]{2,8}$"},
                                                   "tags": {"type": "array", "maxItems": 50}}})  # fmt: skip
    deep: dict = {"type": "string"}  # type: ignore[type-arg]
    for _ in range(100):
        deep = {"type": "object", "properties": {"a": deep}}
    for schema, says in (
        (deep, "nests"),
        ({"type": "string", "maxLength": MAX_REPEAT + 1}, "maxLength"),
        ({"type": "array", "minItems": 10**9}, "minItems"),
        ({"type": "string", "pattern": "^a{2,100000}$"}, "pattern"),
        ({"type": "string", "pattern": "a" * 5000}, "pattern"),
        ({"enum": list(range(30000))}, "parts"),
    ):
        with pytest.raises(TooBig, match=says):
            check_schema(schema)
