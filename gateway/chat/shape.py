"""One choice's answer, shaped as OpenAI output while the worker's text flows in:
reasoning split off, tool calls parsed out, logprobs converted.

The worker only produces text; everything OpenAI-specific about its meaning is here,
token by token, so a stream shows reasoning, content and tool-call fragments as they
are generated, and a non-streamed answer is the same pieces joined.
"""

from __future__ import annotations

import uuid

from gateway.chat.convert import Shape
from gateway.chat.reasoning import ReasoningSplitter
from gateway.chat.tool_calls import ArgsDelta, CallStart, ContentDelta, ToolCallStream
from protocol import chat, wire

Piece = tuple[chat.ChunkDelta, chat.ChoiceLogprobs | None]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _top(raw: bytes, logprob: float) -> chat.TopLogprob:
    return chat.TopLogprob(token=raw.decode(errors="replace"), logprob=logprob, bytes=list(raw))


def convert_logprobs(items: list[wire.TokenLogprob]) -> list[chat.TokenLogprob]:
    """Token texts are decoded leniently: a token may hold part of a UTF-8 character; `bytes` is exact."""
    out = []
    for t in items:
        top = [_top(b, lp) for b, lp in t.top]
        out.append(chat.TokenLogprob(token=t.token.decode(errors="replace"), logprob=t.logprob, bytes=list(t.token),
                                     top_logprobs=top))  # fmt: skip
    return out


class ChoiceShaper:
    def __init__(self, index: int, shape: Shape, tool_format: str = "") -> None:
        """`tool_format`: the tool-call syntax the model's template teaches (the worker's Ready)."""
        self.index = index
        self.plain = shape.plain
        self.splitter = ReasoningSplitter() if shape.reasoning else None
        self.parser = ToolCallStream(shape.tools, tool_format) if shape.tools is not None else None
        self.max_calls = 1 if shape.one_call else None
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.call_ids: list[str] = []
        self.logprobs: list[chat.TokenLogprob] | None = [] if shape.logprobs else None

    def start(self, reasoning_open: bool) -> None:
        """Before any text: the prompt itself opened a reasoning block (the worker's Started)."""
        if reasoning_open and self.splitter is not None:
            self.splitter = ReasoningSplitter(starts_in_reasoning=True)

    def feed(self, text: str, logprobs: list[wire.TokenLogprob] | None = None) -> Piece | None:
        """The delta for this piece of text, and its tokens' logprobs (None when it releases nothing yet)."""
        if self.splitter is not None:
            reasoning, content = self.splitter.feed(text)
        else:
            reasoning, content = "", text
        return self._delta(reasoning, content, logprobs, self.parser.feed(content) if self.parser and content else None)

    def finish(self) -> Piece | None:
        """Whatever the parsers still hold, at the end of the answer."""
        reasoning, content = self.splitter.finish() if self.splitter is not None else ("", "")
        events = None
        if self.parser is not None:
            events = self.parser.feed(content) if content else []
            events += self.parser.finish()
        return self._delta(reasoning, content, None, events)

    def _delta(self, reasoning: str, content: str, logprobs: list[wire.TokenLogprob] | None,
               events: list[ContentDelta | CallStart | ArgsDelta] | None) -> Piece | None:  # fmt: skip
        calls: list[chat.ChunkToolCall] | None = None
        if events is not None:  # the parser decides what of `content` is content
            content = ""
            for ev in events:
                if not isinstance(ev, ContentDelta) and self.max_calls is not None and ev.index >= self.max_calls:
                    continue  # a call the request did not allow (`parallel_tool_calls: false`)
                if isinstance(ev, ContentDelta):
                    content += ev.text
                elif isinstance(ev, CallStart):
                    self.call_ids.append(new_call_id())
                    calls = calls or []
                    calls.append(chat.ChunkToolCall(index=ev.index, id=self.call_ids[ev.index], type="function",
                                                    function=chat.ChunkFunction(name=ev.name, arguments="")))  # fmt: skip
                elif calls and calls[-1].index == ev.index:  # one entry per call per chunk
                    f = calls[-1].function
                    f.arguments = (f.arguments or "") + ev.text
                else:
                    calls = calls or []
                    calls.append(chat.ChunkToolCall(index=ev.index, function=chat.ChunkFunction(arguments=ev.text)))
        if content:
            self.content.append(content)
        if reasoning:
            self.reasoning.append(reasoning)
        lps = convert_logprobs(logprobs) if logprobs else None
        if lps and self.logprobs is not None:
            self.logprobs.extend(lps)
        if not (content or reasoning or calls or lps):
            return None
        delta = chat.ChunkDelta(content=content or None, reasoning_content=reasoning or None,
                                reasoning=reasoning or None, tool_calls=calls)  # fmt: skip
        return delta, chat.ChoiceLogprobs(content=lps) if lps else None

    def choice_logprobs(self) -> chat.ChoiceLogprobs | None:
        return chat.ChoiceLogprobs(content=self.logprobs) if self.logprobs is not None else None

    def finish_reason(self, worker_reason: str) -> str:
        return "tool_calls" if self.call_ids and worker_reason == "stop" else worker_reason

    def message(self) -> chat.AssistantMessage:
        calls = None
        if self.parser is not None and self.parser.calls:
            calls = [chat.ToolCall(id=self.call_ids[i], function=chat.FunctionCall(name=c.name, arguments=c.arguments))
                     for i, c in enumerate(self.parser.calls[:self.max_calls])]  # fmt: skip
        content = "".join(self.content)
        reasoning = "".join(self.reasoning) or None
        return chat.AssistantMessage(role="assistant", content=content if content or not calls else None,
                                     reasoning_content=reasoning, reasoning=reasoning, tool_calls=calls)  # fmt: skip
