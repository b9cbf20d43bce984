"""One sequence's thinking section: whether it is open, how many tokens it has taken, and when its
budget (`Generate.reasoning_budget`) says to close it.

A section is open from the start when the prompt opened it (a template that forces thinking on
ends with `<think>`), or opens when the output itself begins with `<think>` (or `<thinking>`),
whitespace aside. It closes when the model writes the closing tag, or when the budget is spent:
then the engine feeds `closing()`'s text into the sequence as if the model had written it, and the
answer follows. Every token generated while the section is open counts, the one that completes
the closing tag aside; a model that writes neither tag never has a section, and nothing counts.

Only the `<think>` family is read: gpt-oss's harmony analysis channel is never cut.
"""

from __future__ import annotations

import enum

UNLIMITED = -1
OPEN_TAGS = {"<think>": "</think>", "<thinking>": "</thinking>"}
# What thinking templates (Qwen3's, DeepSeek-R1's) put around the closing tag when they render a
# past turn: the reasoning on its own lines, the answer after a blank line.
BEFORE_CLOSE, AFTER_CLOSE = "\n", "\n\n"


class Section(enum.Enum):
    START = "start"  # nothing but whitespace yet: the output may still open one
    OPEN = "open"
    CLOSED = "closed"  # closed, or never opened: nothing more counts


class ThinkBudget:
    def __init__(self, budget: int, *, opened: bool) -> None:
        self.budget = budget
        self.state = Section.OPEN if opened else Section.START
        self.close = "</think>"
        self.tokens = 0  # generated inside the section
        self._lead = ""  # START: the output so far
        self._tail = ""  # OPEN: the last characters, to find a closing tag split across tokens

    @property
    def spent(self) -> bool:
        """The section is open and its budget is used up: close it now."""
        return self.state is Section.OPEN and self.budget != UNLIMITED and self.tokens >= self.budget

    def feed(self, text: str) -> bool:
        """One generated token's text; whether the budget is now spent."""
        if self.state is Section.START:
            self._lead += text
            lead = self._lead.lstrip()
            for tag, close in OPEN_TAGS.items():
                if lead.startswith(tag):
                    self.state, self.close, self._tail = Section.OPEN, close, lead[len(tag) :]
                    break
            else:
                if lead and not any(tag.startswith(lead) for tag in OPEN_TAGS):
                    self.state = Section.CLOSED
        elif self.state is Section.OPEN:
            seen = self._tail + text
            if self.close in seen:
                self.state = Section.CLOSED
            else:
                self.tokens += 1
                self._tail = seen[-len(self.close) :]
        return self.spent

    def closing(self) -> str:
        """The text that ends the section (the section is closed from here on)."""
        self.state = Section.CLOSED
        return BEFORE_CLOSE + self.close + AFTER_CLOSE
