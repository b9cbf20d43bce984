"""The answer as Responses output items, built piece by piece, with the stream events that tell it.

The chat shaper's pieces (reasoning, content, tool-call fragments) open, extend and close items:
a `reasoning` item, a `message` item with one `output_text` part, a `function_call` item per
call, in the order the model writes them. The non-streamed answer is built by the same object
(its events unused), so a stream's events always add up to the non-streamed response.

A call of an MCP tool (`Toolset.mcp`) is an `mcp_call` item instead: opened with its arguments'
deltas as the model writes them, then left `calling` (`pending`) until the server's call ends
(`called`); or, where the call waits for the client's approval, an `mcp_approval_request` item.
A response that runs MCP calls spans several rounds of the model over this one object, so the
output indexes and sequence numbers run on across them.
"""

from __future__ import annotations

import time

import msgspec

from gateway.dialects.responses.mcp import APPROVAL_PREFIX, listed_item
from gateway.dialects.responses.tools import McpTarget, Toolset
from gateway.dialects.responses.translate import new_id, usage_of
from gateway.mcp.results import Outcome
from protocol import chat
from protocol import responses as r


class OutputStream:
    def __init__(self, response: r.Response, tools: Toolset | None = None, summary: bool = False) -> None:
        """`response`: the skeleton (id, model, the request's settings), status in_progress;
        `tools`: how a call's name splits into namespace and name; `summary`: the reasoning is
        also given as its summary (`reasoning.summary` asked for one)."""
        self.response = response
        self.tools = tools or Toolset()
        self.summary = summary
        self.seq = 0
        self.items: list[r.OutputItem] = []  # closed items
        self.kind = ""  # the open item: "reasoning", "message" or "function_call"; "": none
        self.item_id = ""
        self.call_id = ""
        self.name = ""
        self.chunks: list[str] = []  # the open item's text (or arguments) so far
        # Reasoning tokens: the worker counts tokens, not which side of a reasoning split they fell
        # on. Tokens are assigned as their text is released, by characters where one piece holds both.
        self.reasoning_tokens = 0
        self._counted = 0  # tokens already assigned
        self.started = False
        self.pending: list[int] = []  # the output indexes of MCP calls made but not yet run

    def _n(self) -> int:
        self.seq += 1
        return self.seq - 1

    @property
    def index(self) -> int:
        return len(self.items)

    def start(self) -> list[r.StreamEvent]:
        self.started = True
        return [r.Created(self._n(), self.response), r.InProgress(self._n(), self.response)]

    # ---- items -------------------------------------------------------------------

    def _open(self, kind: str, out: list[r.StreamEvent], call_id: str = "", name: str = "") -> None:
        self._close("completed", out)
        self.kind, self.chunks = kind, []
        i = self.index
        if kind == "message":
            self.item_id = new_id("msg")
            item: r.OutputItem = r.OutputMessage(id=self.item_id, status="in_progress", content=[])
            out.append(r.ItemAdded(self._n(), i, item))
            out.append(r.PartAdded(self._n(), self.item_id, i, 0, r.OutputText(text="")))
        elif kind == "reasoning":
            self.item_id = new_id("rs")
            out.append(r.ItemAdded(self._n(), i, r.Reasoning(id=self.item_id, status="in_progress")))
            if self.summary:
                out.append(r.SummaryPartAdded(self._n(), self.item_id, i, 0, r.SummaryText(text="")))
            out.append(r.PartAdded(self._n(), self.item_id, i, 0, r.ReasoningText(text="")))
        elif kind == "mcp_call":
            self.item_id = "mcp_" + call_id.removeprefix("call_")
            self.call_id, self.name = call_id, name
            out.append(r.ItemAdded(self._n(), i, self._mcp_call("")))
            out.append(r.McpCallInProgress(self._n(), self.item_id, i))
        elif kind == "mcp_approval":
            self.item_id = APPROVAL_PREFIX + call_id.removeprefix("call_")
            self.call_id, self.name = call_id, name
            target = self.tools.mcp[name]
            item = r.McpApprovalRequest(id=self.item_id, server_label=target.label, name=target.name, arguments="")
            out.append(r.ItemAdded(self._n(), i, item))
        else:
            self.item_id = "fc_" + call_id.removeprefix("call_")
            self.call_id, self.name = call_id, name
            out.append(r.ItemAdded(self._n(), i, self._call("", "in_progress")))

    def _close(self, status: r.ItemStatus, out: list[r.StreamEvent]) -> None:
        if not self.kind:
            return
        i, text = self.index, "".join(self.chunks)
        item: r.OutputItem
        if self.kind == "message":
            part = r.OutputText(text=text)
            out.append(r.TextDone(sequence_number=self._n(), item_id=self.item_id, output_index=i, content_index=0,
                                  text=text))  # fmt: skip
            out.append(r.PartDone(self._n(), self.item_id, i, 0, part))
            item = r.OutputMessage(id=self.item_id, status=status, content=[part])
        elif self.kind == "reasoning":
            out.append(r.ReasoningDone(self._n(), self.item_id, i, 0, text))
            out.append(r.PartDone(self._n(), self.item_id, i, 0, r.ReasoningText(text)))
            summary = [r.SummaryText(text)] if self.summary else []
            if summary:
                out.append(r.SummaryDone(self._n(), self.item_id, i, 0, text))
                out.append(r.SummaryPartDone(self._n(), self.item_id, i, 0, summary[0]))
            item = r.Reasoning(id=self.item_id, summary=summary, content=[r.ReasoningText(text)], status=status)
        elif self.kind == "mcp_call":
            # Not done: the call runs once the model's turn ends (`called` closes the item).
            out.append(r.McpArgumentsDone(self._n(), self.item_id, i, text))
            self.items.append(self._mcp_call(text))
            self.pending.append(i)
            self.kind = ""
            return
        elif self.kind == "mcp_approval":
            target = self.tools.mcp[self.name]
            item = r.McpApprovalRequest(id=self.item_id, server_label=target.label, name=target.name, arguments=text)
        else:
            out.append(r.ArgumentsDone(self._n(), self.item_id, i, text))
            item = self._call(text, status)
        out.append(r.ItemDone(self._n(), i, item))
        self.items.append(item)
        self.kind = ""

    def _mcp_call(self, arguments: str) -> r.McpCall:
        target = self.tools.mcp[self.name]
        return r.McpCall(id=self.item_id, server_label=target.label, name=target.name, arguments=arguments,
                         status="in_progress")  # fmt: skip

    def _call(self, arguments: str, status: r.ItemStatus) -> r.FunctionCall:
        namespace, name = self.tools.split(self.name)
        return r.FunctionCall(id=self.item_id, call_id=self.call_id, name=name, namespace=namespace,
                              arguments=arguments, status=status)  # fmt: skip

    # ---- pieces ------------------------------------------------------------------

    def text(self, text: str) -> list[r.StreamEvent]:
        """Plain text (no tools, nothing to split), without building a ChunkDelta: the common case."""
        out: list[r.StreamEvent] = []
        if self.kind != "message":
            self._open("message", out)
        self.chunks.append(text)
        out.append(r.TextDelta(sequence_number=self._n(), item_id=self.item_id, output_index=self.index,
                               content_index=0, delta=text))  # fmt: skip
        return out

    def feed(self, delta: chat.ChunkDelta, n_tokens: int) -> list[r.StreamEvent]:
        """A shaped piece of the answer; `n_tokens`: the answer's tokens so far (the worker's count)."""
        out: list[r.StreamEvent] = []
        if delta.reasoning_content:
            if self.kind != "reasoning":
                self._open("reasoning", out)
            self.chunks.append(delta.reasoning_content)
            out.append(r.ReasoningDelta(self._n(), self.item_id, self.index, 0, delta.reasoning_content))
            if self.summary:
                out.append(r.SummaryDelta(self._n(), self.item_id, self.index, 0, delta.reasoning_content))
        if delta.content:
            out.extend(self.text(delta.content))
        for call in delta.tool_calls or []:
            if call.id is not None:  # a new call: its id and name come first, then its arguments
                name = call.function.name or ""
                target = self.tools.mcp.get(name)
                kind = "function_call" if target is None else "mcp_approval" if target.approval else "mcp_call"
                self._open(kind, out, call.id, name)
            if call.function.arguments:
                self.chunks.append(call.function.arguments)
                if self.kind == "function_call":
                    out.append(r.ArgumentsDelta(self._n(), self.item_id, self.index, call.function.arguments))
                elif self.kind == "mcp_call":
                    out.append(r.McpArgumentsDelta(self._n(), self.item_id, self.index, call.function.arguments))
        self._count(delta, n_tokens)
        return out

    def _count(self, delta: chat.ChunkDelta, n_tokens: int) -> None:
        new = n_tokens - self._counted
        if new <= 0:
            return
        thought = len(delta.reasoning_content or "")
        if not thought:
            self._counted = n_tokens
            return
        said = len(delta.content or "") + sum(len(c.function.arguments or "") for c in delta.tool_calls or [])
        self.reasoning_tokens += round(new * thought / (thought + said))
        self._counted = n_tokens

    # ---- MCP -------------------------------------------------------------------------

    def listed(self) -> list[r.StreamEvent]:
        """An `mcp_list_tools` item per `mcp` tool: what the model is offered of its server."""
        out: list[r.StreamEvent] = []
        for label, tools in self.tools.mcp_listed:
            i, item = self.index, listed_item(new_id("mcpl"), label, tools)
            out.append(r.ItemAdded(self._n(), i, r.McpListTools(id=item.id, server_label=label, tools=[])))
            out.append(r.McpListToolsInProgress(self._n(), item.id, i))
            out.append(r.McpListToolsCompleted(self._n(), item.id, i))
            out.append(r.ItemDone(self._n(), i, item))
            self.items.append(item)
        return out

    def approved(self, seen: str, arguments: str, approval_id: str) -> tuple[int, list[r.StreamEvent]]:
        """The `mcp_call` item of a call the client approved (run before the model's next turn)."""
        i, target = self.index, self.tools.mcp[seen]
        item = r.McpCall(id=new_id("mcp"), server_label=target.label, name=target.name, arguments=arguments,
                         status="in_progress", approval_request_id=approval_id)  # fmt: skip
        self.items.append(item)
        self.pending.append(i)
        return i, [r.ItemAdded(self._n(), i, item), r.McpCallInProgress(self._n(), item.id, i),
                   r.McpArgumentsDone(self._n(), item.id, i, arguments)]  # fmt: skip

    def target(self, index: int) -> McpTarget:
        item = self.items[index]
        assert isinstance(item, r.McpCall)
        return next(t for t in self.tools.mcp.values() if t.label == item.server_label and t.name == item.name)

    def called(self, index: int, outcome: Outcome) -> list[r.StreamEvent]:
        """A pending call's end: its item completed with the tool's output, or failed with the error."""
        item = self.items[index]
        assert isinstance(item, r.McpCall)
        ok = outcome.error is None
        item = msgspec.structs.replace(item, output=outcome.output, error=outcome.error,
                                       status="completed" if ok else "failed")  # fmt: skip
        self.items[index] = item
        self.pending.remove(index)
        done = r.McpCallCompleted if ok else r.McpCallFailed
        return [done(self._n(), item.id, index), r.ItemDone(self._n(), index, item)]

    def close(self, status: r.ItemStatus = "completed") -> list[r.StreamEvent]:
        """Close the open item (a turn that ends in MCP calls continues after them)."""
        out: list[r.StreamEvent] = []
        self._close(status, out)
        return out

    # ---- the end -----------------------------------------------------------------

    def finish(self, finish_reason: str, usage: chat.Usage) -> list[r.StreamEvent]:
        """Close the open item and end the response: `response.completed`, or `response.incomplete`
        when the answer was cut at `max_output_tokens` (its last item `incomplete`)."""
        cut = finish_reason == "length"
        out: list[r.StreamEvent] = []
        self._close("incomplete" if cut else "completed", out)
        self.response = msgspec.structs.replace(
            self.response,
            status="incomplete" if cut else "completed",
            completed_at=None if cut else int(time.time()),
            incomplete_details=r.IncompleteDetails("max_output_tokens") if cut else None,
            output=self.items,
            usage=usage_of(usage, self.reasoning_tokens),
        )
        out.append((r.Incomplete if cut else r.Completed)(self._n(), self.response))
        return out

    def fail(self, message: str) -> list[r.StreamEvent]:
        """A stream that broke after its first event: `response.failed`, with what was made so far."""
        self.response = msgspec.structs.replace(self.response, status="failed", output=self.items,
                                                error=r.ResponseError("server_error", message))  # fmt: skip
        return [r.Failed(self._n(), self.response)]
