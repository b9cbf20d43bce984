"""The relay's per-choice shaping on recorded worker text: reasoning, tool calls, logprobs."""

from gateway.chat.convert import Shape
from gateway.chat.shape import ChoiceShaper
from protocol.wire import TokenLogprob


def run(shaper: ChoiceShaper, pieces: list[str]) -> list[object]:
    out = [shaper.feed(p) for p in pieces]
    out.append(shaper.finish())
    return [o for o in out if o is not None]


def test_an_answer_whose_prompt_opened_reasoning_starts_as_reasoning() -> None:
    s = ChoiceShaper(0, Shape(reasoning=True))
    s.start(reasoning_open=True)  # the worker's Started: the template opened <think> itself
    run(s, ["let me", " see", "</think>", "4."])
    msg = s.message()
    assert (msg.reasoning_content, msg.content) == ("let me see", "4.")
    plain = ChoiceShaper(0, Shape())  # no split asked: the flag changes nothing
    plain.start(reasoning_open=True)
    run(plain, ["let me", "</think>4."])
    assert plain.message().content == "let me</think>4."


def test_reasoning_then_content_in_order() -> None:
    s = ChoiceShaper(0, Shape(reasoning=True))
    pieces = run(s, ["<think>", "let me", " see", "</think>", "The answer", " is 4."])
    kinds = [("r" if d.reasoning_content else "") + ("c" if d.content else "") for d, _ in pieces]
    assert kinds[0] == "r" and kinds[-1] == "c"
    msg = s.message()
    assert (msg.reasoning_content, msg.reasoning, msg.content) == ("let me see", "let me see", "The answer is 4.")


def test_tool_call_pieces_and_message_agree() -> None:
    s = ChoiceShaper(0, Shape(tools=frozenset({"f"})))
    text = '<tool_call>{"name": "f", "arguments": {"q": "a long query string"}}</tool_call>'
    pieces = run(s, [text[i : i + 5] for i in range(0, len(text), 5)])
    calls = [tc for d, _ in pieces for tc in d.tool_calls or []]
    assert calls[0].id and calls[0].function.name == "f" and calls[0].type == "function"
    assert "".join(c.function.arguments or "" for c in calls) == '{"q": "a long query string"}'
    msg = s.message()
    assert msg.content is None and msg.tool_calls[0].id == calls[0].id
    assert s.finish_reason("stop") == "tool_calls" and s.finish_reason("length") == "length"


def test_one_call_keeps_the_first_call_only() -> None:
    text = ('<tool_call>{"name": "f", "arguments": {"q": 1}}</tool_call>'
            '<tool_call>{"name": "f", "arguments": {"q": 2}}</tool_call>')  # fmt: skip
    for one_call, expected in ((False, 2), (True, 1)):
        s = ChoiceShaper(0, Shape(tools=frozenset({"f"}), one_call=one_call))
        pieces = run(s, [text[i : i + 7] for i in range(0, len(text), 7)])
        streamed = [tc for d, _ in pieces for tc in d.tool_calls or []]
        assert len({tc.index for tc in streamed}) == expected
        assert "".join(tc.function.arguments or "" for tc in streamed) == '{"q": 1}' + (
            '{"q": 2}' if expected == 2 else ""
        )
        assert len(s.message().tool_calls or []) == expected


def test_logprobs_ride_with_their_text() -> None:
    s = ChoiceShaper(0, Shape(logprobs=True))
    lp = [TokenLogprob(b"Hi", -0.5, [(b"Hi", -0.5), (b"Yo", -1.5)])]
    delta, lps = s.feed("Hi", lp)
    assert delta.content == "Hi" and lps.content[0].token == "Hi" and lps.content[0].bytes == [72, 105]
    assert [t.token for t in lps.content[0].top_logprobs] == ["Hi", "Yo"]
    assert s.choice_logprobs().content == lps.content
