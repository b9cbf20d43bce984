"""gateway.chat.tool_calls on recorded-style model outputs: every case is checked whole, in every two-piece split,
one character at a time and in seeded random chunks, and must give the same content and calls each time."""

from __future__ import annotations

import json

import pytest

from gateway.chat.tool_calls import (
    ArgsDelta,
    CallStart,
    ContentDelta,
    Event,
    ToolCall,
    ToolCallStream,
    parse_tool_calls,
)
from tests.splits import chunkings as split_ways

WEATHER = {"get_weather", "get_time", "search", "write_file", "calculator"}


def chunkings(text: str) -> list[list[str]]:
    return split_ways(text, max_piece=12)


def stream(pieces: list[str], names: set[str] | None) -> tuple[list[list[Event]], ToolCallStream]:
    s = ToolCallStream(names)
    per_feed = [s.feed(p) for p in pieces]
    per_feed.append(s.finish())
    return per_feed, s


def check_events(events: list[Event], calls: list[ToolCall]) -> str:
    """The invariants of one event sequence; returns its content."""
    started: list[str] = []
    args: dict[int, list[str]] = {}
    for ev in events:
        if isinstance(ev, CallStart):
            assert ev.index == len(started)  # indexes 0, 1, 2... in order
            started.append(ev.name)
        elif isinstance(ev, ArgsDelta):
            assert ev.index == len(started) - 1 and ev.text  # args of the call just started, never empty
            args.setdefault(ev.index, []).append(ev.text)
        else:
            assert isinstance(ev, ContentDelta) and ev.text
    assert [c.name for c in calls] == started
    assert ["".join(args.get(i, [])) for i in range(len(calls))] == [c.arguments for c in calls]
    return "".join(e.text for e in events if isinstance(e, ContentDelta))


def parse(text: str, names: set[str] | None = None) -> tuple[str, list[tuple[str, str]]]:
    """parse_tool_calls, after checking every split of `text` streams to the same result."""
    content, calls = parse_tool_calls(text, names)
    for pieces in chunkings(text):
        per_feed, s = stream(pieces, names)
        assert check_events([e for f in per_feed for e in f], s.calls) == content, pieces
        assert s.calls == calls, pieces
    return content, [(c.name, c.arguments) for c in calls]


def char_events(text: str, names: set[str] | None = None) -> list[tuple[int, Event]]:
    """(index of the character whose feed released it, event), feeding one character at a time."""
    per_feed, _ = stream(list(text), names)
    return [(i, e) for i, f in enumerate(per_feed) for e in f]


# -- Hermes / Qwen --

QWEN_PROSE_CALL = (
    "I'll check the current weather in Paris for you.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"location": "Paris, France", "unit": "celsius"}}\n</tool_call>'
)


def test_qwen_prose_then_call() -> None:
    assert parse(QWEN_PROSE_CALL, WEATHER) == (
        "I'll check the current weather in Paris for you.",
        [("get_weather", '{"location": "Paris, France", "unit": "celsius"}')],
    )


def test_qwen_parallel_calls() -> None:
    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}\n</tool_call>'
    )
    assert parse(text, WEATHER) == (
        "",
        [("get_weather", '{"location": "Paris"}'), ("get_time", '{"timezone": "Europe/Paris"}')],
    )


def test_hermes_strings_with_braces_quotes_and_markers() -> None:
    args = (
        r'{"path": "notes/a.md", "content": "# Title\n\nUse `{\"k\": [1, {2}]}` and </tool_call> or '
        r'<tool_call> here: \\\"done\\\" }]}\\", "mode": {"append": false, "tags": ["a]", "{b"]}}'
    )
    json.loads(args)  # the recorded arguments are valid JSON
    text = f'Writing it now.\n\n<tool_call>\n{{"name": "write_file", "arguments": {args}}}\n</tool_call>\n'
    assert parse(text, WEATHER) == ("Writing it now.", [("write_file", args)])


def test_hermes_without_closing_brace_or_tag() -> None:
    text = '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "UTC"}\n</tool_call>'
    assert parse(text, WEATHER) == ("", [("get_time", '{"timezone": "UTC"}')])
    text = '<tool_call>\n{"name": "get_time", "arguments": {}}<tool_call>{"name": "search", "arguments": {}}'
    assert parse(text, WEATHER) == ("", [("get_time", "{}"), ("search", "{}")])


def test_text_after_the_last_call() -> None:
    base = '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>'
    assert parse(base + "\n\n  \n", WEATHER) == ("", [("search", '{"q": "x"}')])
    assert parse(base + "\n\nI have asked for it.", WEATHER) == ("I have asked for it.", [("search", '{"q": "x"}')])


def test_prose_with_braces_before_a_call() -> None:
    text = 'Using the template {city} and [1]:\n<tool_call>\n{"name": "search", "arguments": {"q": "{city}"}}\n</tool_call>'
    assert parse(text, WEATHER) == ("Using the template {city} and [1]:", [("search", '{"q": "{city}"}')])


# -- Llama 3.x --


def test_llama_python_tag() -> None:
    text = '<|python_tag|>{"name": "get_weather", "parameters": {"location": "San Francisco, CA"}}<|eom_id|>'
    assert parse(text, WEATHER) == ("", [("get_weather", '{"location": "San Francisco, CA"}')])


def test_llama_json_without_tag_and_parallel() -> None:
    text = '{"name": "get_weather", "parameters": {"location": "Tokyo", "days": 3}}'
    assert parse(text, WEATHER) == ("", [("get_weather", '{"location": "Tokyo", "days": 3}')])
    text = (
        '{"name": "get_weather", "parameters": {"location": "Oslo"}}; {"name": "get_time", "parameters": {"tz": "CET"}}'
    )
    assert parse(text, WEATHER) == ("", [("get_weather", '{"location": "Oslo"}'), ("get_time", '{"tz": "CET"}')])
    text = '{"name": "get_weather", "parameters": {"location": "Oslo"}}\n{"name": "get_time", "parameters": {}}\n'
    assert parse(text, WEATHER) == ("", [("get_weather", '{"location": "Oslo"}'), ("get_time", "{}")])


def test_llama_python_tag_with_semicolons() -> None:
    text = (
        '<|python_tag|>{"name": "calculator", "parameters": {"expr": "2+2"}};'
        ' {"name": "calculator", "parameters": {"expr": "3*3"}}<|eom_id|>'
    )
    assert parse(text, WEATHER) == ("", [("calculator", '{"expr": "2+2"}'), ("calculator", '{"expr": "3*3"}')])


# -- Mistral --


def test_mistral_array() -> None:
    text = (
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"location": "Lyon", "unit": "celsius"}, "id": "a1B2c3D4e"}, '
        '{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}, "id": "f5G6h7I8j"}]'
    )
    assert parse(text, WEATHER) == (
        "",
        [("get_weather", '{"location": "Lyon", "unit": "celsius"}'), ("get_time", '{"timezone": "Europe/Paris"}')],
    )


def test_mistral_name_args() -> None:
    text = '[TOOL_CALLS]get_weather[ARGS]{"location": "Lyon"}[TOOL_CALLS]get_time[ARGS]{"timezone": "CET"}</s>'
    assert parse(text, WEATHER) == ("", [("get_weather", '{"location": "Lyon"}'), ("get_time", '{"timezone": "CET"}')])
    text = '[TOOL_CALLS]search[CALL_ID]a1B2c3D4e[ARGS]{"q": "[ARGS] inside"}'
    assert parse(text, WEATHER) == ("", [("search", '{"q": "[ARGS] inside"}')])


def test_mistral_prose_then_call_and_unknown_name() -> None:
    text = 'Let me look.[TOOL_CALLS]search[ARGS]{"q": "x"}'
    assert parse(text, WEATHER) == ("Let me look.", [("search", '{"q": "x"}')])
    text = '[TOOL_CALLS]rm_rf[ARGS]{"path": "/"}'
    assert parse(text, WEATHER) == (text, [])


# -- plain JSON --


def test_plain_object_array_and_openai_nesting() -> None:
    text = '\n  {"name": "search", "arguments": {"q": "llama.cpp", "n": 5, "exact": true, "tags": null}}\n'
    assert parse(text) == ("", [("search", '{"q": "llama.cpp", "n": 5, "exact": true, "tags": null}')])
    text = '[{"name": "get_weather", "arguments": {"location": "Rome"}},\n {"name": "get_time", "arguments": {}}]'
    assert parse(text) == ("", [("get_weather", '{"location": "Rome"}'), ("get_time", "{}")])
    text = (
        '[{"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{\\"q\\": \\"a b\\"}"}}, '
        '{"type": "function", "function": {"arguments": {"q": "c"}, "name": "search"}}]'
    )
    assert parse(text, WEATHER) == ("", [("search", '{"q": "a b"}'), ("search", '{"q": "c"}')])


def test_fenced_json() -> None:
    text = '```json\n{"name": "get_weather", "arguments": {"location": "Bern"}}\n```'
    assert parse(text, WEATHER) == ("", [("get_weather", '{"location": "Bern"}')])
    text = '```json\n[\n  {"name": "get_weather", "arguments": {"location": "Bern"}},\n  {"name": "get_time"}\n]\n```\nDone.'
    assert parse(text, WEATHER) == ("Done.", [("get_weather", '{"location": "Bern"}'), ("get_time", "{}")])
    text = "```python\nprint({'name': 'x'})\n```"
    assert parse(text, WEATHER) == (text, [])


def test_arguments_as_string_and_before_name_and_missing() -> None:
    text = '{"name": "search", "arguments": "{\\"query\\": \\"caf\\u00e9 \\\\\\"best\\\\\\"\\", \\"limit\\": 5}"}'
    content, calls = parse(text, WEATHER)
    assert content == "" and calls == [("search", '{"query": "café \\"best\\"", "limit": 5}')]
    assert json.loads(calls[0][1]) == {"query": 'café "best"', "limit": 5}
    text = '{"arguments": {"location": "Nice", "days": [1, 2]}, "name": "get_weather"}'
    assert parse(text, WEATHER) == ("", [("get_weather", '{"location": "Nice", "days": [1, 2]}')])
    assert parse('{"name": "get_time"}', WEATHER) == ("", [("get_time", "{}")])
    assert parse('{"name": "get_time", "arguments": null}', WEATHER) == ("", [("get_time", "{}")])
    assert parse('{"name": "get_time", "arguments": ""}', WEATHER) == ("", [("get_time", "{}")])


def test_any_name_without_tool_names() -> None:
    text = '<tool_call>\n{"name": "lookup_v2.run", "arguments": {"x": 1}}\n</tool_call>'
    assert parse(text) == ("", [("lookup_v2.run", '{"x": 1}')])
    text = '{"name": "Ada Lovelace", "born": 1815}'  # not a function name: an answer in JSON
    assert parse(text) == (text, [])


# -- not calls: content, unchanged --


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "delete_everything", "arguments": {"force": true}}',
        '<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>',
        '<|python_tag|>{"name": "exec", "parameters": {"code": "rm"}}',
        '{name: "get_weather", arguments: {}}',
        '{"name": get_weather, "arguments": {}}',
        '{"name": ["get_weather"]}',
        '<tool_call>\n{"location": "Paris"}\n</tool_call>',
        '{"answer": 42, "explanation": "the {usual} one"}',
        "[1, 2, 3]",
        "[]",
        "{}",
        '{"name": "get_wea',
        "<tool_call>\nI cannot call tools.",
        "[TOOL_CALLS] sorry, no",
        "[TOOL_CALLS]get_weather[ARG]{}",
        '<|python_tag|>brave_search.call(query="weather")',
    ],
)
def test_not_a_call_is_content(text: str) -> None:
    assert parse(text, WEATHER) == (text, [])


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n",
        "Hello! How can I help you today?",
        "  Leading and trailing space  \n\n",
        'Arrays look like [1, 2] and objects like {"a": 1}; tags like <b>bold</b> and <tool> or [TOOL].',
        "Ends with a partial marker <tool_",
        "Ends with [TOOL_CALL",
        "Ends with <|python",
        "Use the <tool_call> tag to call a tool.",
        'The JSON is:\n{"name": "get_weather", "arguments": {}}',
        "Here 🌊 unicode — fine… ```json\n{}\n```",
        "`code` and ``` fences ```",
    ],
)
def test_no_calls_content_unchanged(text: str) -> None:
    assert parse(text, WEATHER) == (text, [])


def test_unknown_name_after_a_call_in_an_array() -> None:
    text = '[{"name": "search", "arguments": {"q": 1}}, {"name": "zzz", "arguments": {}}]'
    content, calls = parse(text, WEATHER)
    assert calls == [("search", '{"q": 1}')]
    assert content == ', {"name": "zzz", "arguments": {}}]'  # nothing is lost


def test_truncated_call_keeps_what_streamed() -> None:
    # The output hit max_tokens inside the arguments: the fragments already sent stand.
    text = '<tool_call>\n{"name": "search", "arguments": {"q": "long que'
    assert parse(text, WEATHER) == ("", [("search", '{"q": "long que')])
    text = '<tool_call>\n{"name": "search", "arguments": "{\\"q\\": '
    assert parse(text, WEATHER) == ("", [("search", "{}")])


def test_broken_after_name_ends_the_call() -> None:
    # Once the name is streamed the call cannot be taken back; the rest is read as text.
    text = '{"name": "search" "arguments": {}}'
    assert parse(text, WEATHER) == ('"arguments": {}}', [("search", "{}")])


# -- streaming behaviour --


def test_arguments_stream_fragment_by_fragment() -> None:
    long_args = json.dumps({"query": "a fairly long search query " * 4, "filters": {"year": [2023, 2024]}})
    texts = [
        f'<tool_call>\n{{"name": "search", "arguments": {long_args}}}\n</tool_call>',
        f'<|python_tag|>{{"name": "search", "parameters": {long_args}}}',
        f"[TOOL_CALLS]search[ARGS]{long_args}",
        f'[TOOL_CALLS][{{"name": "search", "arguments": {long_args}}}]',
        f'```json\n{{"name": "search", "arguments": {long_args}}}\n```',
        f'{{"type": "function", "function": {{"name": "search", "arguments": {long_args}}}}}',
    ]
    for text in texts:
        assert parse(text, WEATHER)[1] == [("search", long_args)]
        events = char_events(text, WEATHER)
        start = [i for i, e in events if isinstance(e, CallStart)]
        args = [i for i, e in events if isinstance(e, ArgsDelta)]
        assert len(start) == 1 and len(args) >= len(long_args) // 2, text
        assert start[0] < args[0] and args[-1] - start[0] > len(long_args) // 2, text
        # CallStart comes as soon as the name's closing quote (or [ARGS]) is read
        end_of_name = text.index("search") + len("search")
        assert start[0] <= end_of_name + len("[ARGS]"), text


def test_parallel_calls_stream_in_order() -> None:
    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}\n</tool_call>'
    )
    kinds = [(type(e).__name__, getattr(e, "index", None)) for _, e in char_events(text, WEATHER)]
    first_b = kinds.index(("CallStart", 1))
    assert kinds[0] == ("CallStart", 0) and all(k == ("ArgsDelta", 0) for k in kinds[1:first_b])
    assert all(k == ("ArgsDelta", 1) for k in kinds[first_b + 1 :])


def test_prose_flows_and_only_marker_starts_are_held() -> None:
    s = ToolCallStream(WEATHER)
    assert s.feed("Hello, ") == [ContentDelta("Hello,")]  # a trailing space may precede a marker
    assert s.feed("world") == [ContentDelta(" world")]
    assert s.feed(". Let me check.\n<tool_") == [ContentDelta(". Let me check.")]
    assert s.feed('call>\n{"name": "get_weather"') == [CallStart(0, "get_weather")]
    assert s.feed(', "arguments": {"location": ') == [ArgsDelta(0, '{"location": ')]
    assert s.feed('"Paris"}}') == [ArgsDelta(0, '"Paris"}')]
    assert s.feed("\n</tool_call>\n") == []
    assert s.finish() == []
    assert s.calls == [ToolCall("get_weather", '{"location": "Paris"}')]


def test_partial_markers_are_released_when_they_fail() -> None:
    s = ToolCallStream(WEATHER)
    assert s.feed("See [TOOL") == [ContentDelta("See")]
    assert s.feed("S] and <tool_") == [ContentDelta(" [TOOLS] and")]
    assert s.feed("x>") == [ContentDelta(" <tool_x>")]
    assert s.feed(" <tool_c") == []
    assert s.finish() == [ContentDelta(" <tool_c")]


def test_json_at_start_is_held_until_decided() -> None:
    s = ToolCallStream(WEATHER)
    assert s.feed('{"answer": ') == []
    assert s.feed("42, ") == []
    assert s.feed("}") == [ContentDelta('{"answer": 42, }')]  # closed without a name
    assert s.feed(" more") == [ContentDelta(" more")]
    s = ToolCallStream(WEATHER)
    assert s.feed('{"name": "nope"') == [ContentDelta('{"name": "nope"')]  # unknown: released at once


def test_mid_prose_brace_is_prose_immediately() -> None:
    s = ToolCallStream(WEATHER)
    assert s.feed("Sure") == [ContentDelta("Sure")]
    assert s.feed(':{"name": "search"') == [ContentDelta(':{"name": "search"')]


def test_arguments_before_name_are_buffered_then_sent() -> None:
    events = char_events('{"arguments": {"q": "x"}, "name": "search"}', WEATHER)
    assert [e for _, e in events] == [CallStart(0, "search"), ArgsDelta(0, '{"q": "x"}')]
