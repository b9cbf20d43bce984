"""One `/v1/responses` request, run as rounds of the model: one round, unless the model calls MCP
tools, which the server runs (gateway/mcp/hub.py) and feeds back for another round.

Each round is planned, run and accounted as a chat completion is (its own usage-ledger entry, so
every round's tokens are billed); its worker messages become output items and events through the
one OutputStream of the response (gateway/dialects/responses/events.py), so the items and sequence
numbers of all rounds are one response's. A streamed and a non-streamed response are the same
events (gateway/http/dialect_stream.py drives each round); the non-streamed one keeps the last.

A round that ends in MCP calls (and no call for the client, no approval request) runs them, at
most `--mcp-max-calls` (or the request's lower `max_tool_calls`) per response; once that many
have run, the next round is offered no tools, so the response ends with the model's answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import msgspec
from litestar import Request
from litestar.response import ServerSentEventMessage

from gateway.chat.convert import ChatPlan, plan_chat, prompt_chars
from gateway.chat.shape import ChoiceShaper
from gateway.dialects.responses.events import OutputStream
from gateway.dialects.responses.mcp import pending_approvals, with_result
from gateway.dialects.responses.tools import Toolset, seen_name
from gateway.dialects.responses.translate import answer_messages, skeleton, wants_summary
from gateway.errors import BadRequest, GenieXError
from gateway.http import dialect_stream, relay
from gateway.http.auth import caller_of, tenant_of
from gateway.http.headers import COMPUTE_FALLBACK_HEADER, KEEP_CACHE_HEADER, header_flag, header_true
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from gateway.mcp import results
from gateway.mcp.results import Outcome, failed
from gateway.models.store import ModelEntry
from gateway.supervisor.deadline import within
from protocol import chat
from protocol import responses as r
from protocol.chat import ChunkDelta
from protocol.wire import Done, ImageInput, Started

T = TypeVar("T")


class Round(NamedTuple):
    c: relay.Completion
    shaper: ChoiceShaper
    first: relay.Tagged
    rest: AsyncIterator[relay.Tagged]
    plan: ChatPlan


class Approved(NamedTuple):
    approval_id: str
    seen: str  # the tool's name as the model sees it
    arguments: str


def approvals(translated: list[tuple[str, r.McpApprovalResponseItem]], conversation: list[chat.ChatMessage],
              tools: Toolset) -> tuple[list[chat.ChatMessage], list[Approved]]:  # fmt: skip
    """The conversation with every waiting approval request answered: approved ones to run (the
    tool's result answers them once run), refused or unanswered ones with why they did not run.
    An approval of a request no longer waiting (a client sending back a whole conversation) is read
    as done; one of a request never made is a 400."""
    waiting = pending_approvals(conversation)
    answered = {c.id for m in conversation if m.role == "assistant" for c in m.tool_calls or []}
    run: list[Approved] = []
    for where, item in translated:
        call = waiting.pop(item.approval_request_id, None)
        if call is None:
            if item.approval_request_id in answered:
                continue
            raise BadRequest(f"`{where}.approval_request_id`: no approval request {item.approval_request_id[:128]!r} "
                             "waits in this conversation (send it back, or continue with `previous_response_id`)")  # fmt: skip
        if not item.approve:
            why = f": {item.reason}" if item.reason else ""
            conversation = with_result(conversation, call.id, f"not run: the user did not approve this call{why}")
        elif call.function.name not in tools.mcp:
            raise BadRequest(f"`{where}`: approval request {call.id[:128]!r} calls {call.function.name[:160]!r}, "
                             "which this request's `tools` do not offer (send its `mcp` tool again)")  # fmt: skip
        else:
            run.append(Approved(call.id, call.function.name, call.function.arguments))
    for call in waiting.values():
        conversation = with_result(conversation, call.id, "not run: it was not approved")
    return conversation, run


class _RoundEvents:
    """dialect_stream's Renderer for one round of the response."""

    def __init__(self, run: ResponseRun, c: relay.Completion) -> None:
        self.run = run
        self.c = c
        self.continues = False  # the round ended in MCP calls to run

    def start(self, prompt_tokens: int, cached_tokens: int) -> list[r.StreamEvent]:
        out = self.run.out
        if out.started:
            return []
        if self.c.truncated is not None:  # from the first event on, what truncation dropped
            out.response.truncated = self.c.truncated
        return out.start()

    def text(self, text: str) -> list[r.StreamEvent]:
        return self.run.out.text(text)

    def piece(self, delta: ChunkDelta, n_tokens: int) -> list[r.StreamEvent]:
        return self.run.out.feed(delta, n_tokens)

    def close(self) -> list[r.StreamEvent]:
        return []  # end() closes the last item, as completed or as cut short

    def end(self, finish_reason: str, done: Done, usage: chat.Usage) -> list[r.StreamEvent]:
        self.run.add(usage)
        if finish_reason == "length":
            return self.run.finish(finish_reason)
        events = self.run.out.close()
        if self.run.out.pending:
            self.continues = True
            return events
        return [*events, *self.run.finish(finish_reason)]

    def fail(self, message: str, status: int, started: bool) -> list[r.StreamEvent]:
        out = self.run.out
        self.run.failure = (message, status)
        return [*([] if out.started else out.start()), *out.fail(message)]


class ResponseRun:
    def __init__(self, request: Request, services: Services, data: r.ResponsesRequest, entry: ModelEntry,
                 req: chat.ChatRequest, conversation: list[chat.ChatMessage], tools: Toolset,
                 images: list[ImageInput]) -> None:  # fmt: skip
        self.request = request
        self.services = services
        self.data = data
        self.entry = entry
        self.req = req
        # What comes before the conversation: instructions, a models-file system prompt.
        self.head = req.messages[: len(req.messages) - len(conversation)]
        self.conversation = conversation
        self.tools = tools
        self.images = images
        self.limit = min(services.settings.mcp_max_calls, data.max_tool_calls or services.settings.mcp_max_calls)
        self.calls = 0  # MCP calls run for this response
        self.usage = chat.Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0)
        self.cached = 0
        self.out: OutputStream = OutputStream(r.Response(id="", created_at=0, status="in_progress", model="",
                                                         output=[]))  # fmt: skip
        self.prelude: list[r.StreamEvent] = []
        self.failure: tuple[str, int] | None = None
        self.keep: Callable[[r.Response], None] = lambda _: None
        self.response_id = ""  # given beforehand (a background response's); else made from the first round's
        self.conversation_ref: r.ConversationRef | None = None  # the `conversation` it reads and adds to

    def continue_from(self, conversation: list[chat.ChatMessage]) -> None:
        """Run with this conversation instead (its approval requests answered)."""
        self.conversation = conversation
        self.req = msgspec.structs.replace(self.req, messages=[*self.head, *conversation])

    async def run_approved(self, approved: list[Approved]) -> list[tuple[Approved, Outcome]]:
        """The calls the client approved, run before the model reads their results (which answer
        their approval requests in the conversation)."""
        if not approved:
            return []
        outcomes = await within(asyncio.gather(*(self.call(a.seen, a.arguments) for a in approved)))
        self.calls += len(approved)
        conversation = self.conversation
        for a, outcome in zip(approved, outcomes, strict=True):
            conversation = with_result(conversation, a.approval_id, outcome.for_model)
        self.continue_from(conversation)
        if self.calls >= self.limit:
            self.req = msgspec.structs.replace(self.req, tool_choice="none")
        return list(zip(approved, outcomes, strict=True))

    # ---- rounds ----------------------------------------------------------------------

    async def round(self) -> Round:
        """The next round's worker stream, its first message read (a refused prompt raises here)."""
        s, req, request = self.services, self.req, self.request
        plan = plan_chat(req, current_request_id() or "", s.store, s.settings.grammar_dirs,
                         keep_cache=header_true(request, KEEP_CACHE_HEADER), tenant=tenant_of(request),
                         images=self.images, truncation=s.settings.truncation,
                         priority=s.priority(request, self.entry))  # fmt: skip
        c = relay.Completion(self.entry.id, s.accounting(self.entry.id, caller_of(request), req.user), id_prefix="resp")
        # A whole answer that is never sent bills nothing; a background one is made for the store.
        c.accounting.bills_partial = self.data.stream or self.data.background
        worker = await c.guard(s.worker(self.entry, nctx=self.data.nctx, compute=self.data.compute,
                                        keep_alive=self.data.keep_alive,
                                        prompt_chars=prompt_chars(req.messages, plan.generate.truncation),
                                        fallback=header_flag(request, COMPUTE_FALLBACK_HEADER)))  # fmt: skip
        shaper = ChoiceShaper(0, plan.shape, worker.ready_info.tool_format if worker.ready_info else "")
        rest = c.run_on(worker, plan.generations())
        first = await c.guard(anext(rest))
        return Round(c, shaper, first, rest, plan)

    def begin(self, first: Round, approved: Sequence[tuple[Approved, Outcome]]) -> None:
        """The response, once its first round is admitted: its skeleton, and the events that come
        before the model's: the MCP tool lists and the approved calls that ran."""
        c, sampling = first.c, first.plan.generate.sampling
        response = skeleton(self.data, self.tools, "resp_" + c.id.rpartition("-")[2], c.created, self.entry.id,
                            sampling.temperature, sampling.top_p, first.plan.generate.truncation)  # fmt: skip
        response = msgspec.structs.replace(response, id=self.response_id or response.id,
                                           background=self.data.background, conversation=self.conversation_ref)  # fmt: skip
        self.out = OutputStream(response, self.tools, summary=wants_summary(self.data))
        if not self.tools.mcp_listed and not approved:
            return
        _, msg = first.first
        if isinstance(msg, Started):
            c.started(msg)
            if c.truncated is not None:
                self.out.response.truncated = c.truncated
        self.prelude = [*self.out.start(), *self.out.listed()]
        for a, outcome in approved:
            index, events = self.out.approved(a.seen, a.arguments, a.approval_id)
            self.prelude += [*events, *self.out.called(index, outcome)]

    def add(self, u: chat.Usage) -> None:
        energy = None if self.usage.energy_j is None and u.energy_j is None else \
            (self.usage.energy_j or 0.0) + (u.energy_j or 0.0)  # fmt: skip
        self.usage = chat.Usage(prompt_tokens=self.usage.prompt_tokens + u.prompt_tokens,
                                completion_tokens=self.usage.completion_tokens + u.completion_tokens,
                                total_tokens=self.usage.total_tokens + u.total_tokens, energy_j=energy)  # fmt: skip
        self.cached += u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0

    def finish(self, finish_reason: str) -> list[r.StreamEvent]:
        """The response's end: calls left unrun fail saying why, then completed (or incomplete)."""
        out = self.out
        events = out.close("incomplete" if finish_reason == "length" else "completed")
        for index in list(out.pending):
            why = ("not run: the response reached `max_output_tokens` in its arguments" if finish_reason == "length"
                   else "not run: the response ended first")  # fmt: skip
            events += out.called(index, self.unrun(out.target(index).label, "not_run", results.NOT_RUN, why))
        usage = self.usage
        if self.cached:
            usage = msgspec.structs.replace(
                usage, prompt_tokens_details=chat.PromptTokensDetails(cached_tokens=self.cached)
            )
        events += out.finish(finish_reason, usage)
        self.keep(out.response)  # stored before its last event goes out: a client continuing at once finds it
        return events

    async def call(self, seen: str, arguments: str) -> Outcome:
        target = self.tools.mcp[seen]
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            return self.unrun(target.label, "bad_arguments", results.BAD_ARGUMENTS,
                              "the model's arguments are not a JSON object")  # fmt: skip
        return await self.services.mcp.call(target.label, target.name, args, target.headers)

    def unrun(self, label: str, outcome: str, code: int, message: str) -> Outcome:
        """A call this response does not run, counted as the calls it runs are."""
        self.services.metrics.mcp_call(label, outcome, 0.0)
        return failed(outcome, code, message)

    async def run_pending(self) -> list[r.StreamEvent]:
        """The round's MCP calls, run at once (each server bounds its own concurrency); those over
        the response's bound fail saying so."""
        out = self.out
        pending = list(out.pending)
        room = max(0, self.limit - self.calls)
        ran, over = pending[:room], pending[room:]
        outcomes = await within(asyncio.gather(*(self._call_item(i) for i in ran)))  # the request's deadline
        self.calls += len(ran)
        events: list[r.StreamEvent] = []
        for index, outcome in zip(ran, outcomes, strict=True):
            events += out.called(index, outcome)
        for index in over:
            why = f"not run: this response reached its bound of {self.limit} MCP calls"
            events += out.called(index, self.unrun(out.target(index).label, "not_run", results.NOT_RUN, why))
        return events

    async def _call_item(self, index: int) -> Outcome:
        item = self.out.items[index]
        assert isinstance(item, r.McpCall)
        return await self.call(seen_name(item.name, item.server_label), item.arguments)

    def next_request(self) -> None:
        """The next round: the conversation with this response's items so far; no tools once the
        response has run its bound of calls."""
        choice: str | dict[str, Any] | None = "auto" if self.calls < self.limit else "none"
        self.req = msgspec.structs.replace(self.req, messages=[*self.head, *self.conversation,
                                                               *answer_messages(self.out.items)],
                                           tool_choice=choice, max_completion_tokens=self.budget())  # fmt: skip

    def budget(self) -> int | None:
        """`max_output_tokens` bounds the whole response, as at OpenAI: a round gets what is left."""
        if self.data.max_output_tokens is None:
            return None
        return self.data.max_output_tokens - self.usage.completion_tokens

    def stops_after_calls(self) -> bool:
        """A round with a call for the client, or an approval request, ends the response (after its
        MCP calls ran): the client has to answer first."""
        return any(isinstance(i, r.FunctionCall | r.McpApprovalRequest) for i in self.out.items)

    # ---- the whole response ---------------------------------------------------------

    async def events(self, first: Round, frame: Callable[[msgspec.Struct], T]) -> AsyncIterator[T]:
        for ev in self.prelude:
            yield frame(ev)
        rnd = first
        while True:
            render = _RoundEvents(self, rnd.c)
            async for x in dialect_stream.drive(rnd.c, rnd.shaper, render, rnd.first, rnd.rest, frame):
                yield x
            if not render.continues:
                return
            try:
                for ev in await self.run_pending():
                    yield frame(ev)
                left = self.budget()
                ending = "stop" if self.stops_after_calls() else "length" if left is not None and left <= 0 else ""
                if ending:
                    for ev in self.finish(ending):
                        yield frame(ev)
                    return
                self.next_request()
                rnd = await self.round()
            except GenieXError as exc:
                for ev in render.fail(exc.message, exc.status, True):
                    yield frame(ev)
                return

    def sse(self, first: Round) -> AsyncIterator[ServerSentEventMessage]:
        return self.events(first, dialect_stream.event)

    async def collect(self, first: Round) -> r.Response:
        async for _ in self.events(first, _same):
            pass
        if self.failure is not None:
            error = GenieXError(self.failure[0])
            error.status = self.failure[1]
            raise error
        return self.out.response


def _same(ev: msgspec.Struct) -> msgspec.Struct:
    return ev
