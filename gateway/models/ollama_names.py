"""How an Ollama client's model name finds a model here (the rule docs/ollama.md states).

1. A name the store resolves (an id `org/repo:precision`, `org/repo`, a models-file alias, a copy)
   is that model; `:latest` is dropped first (Ollama's default tag), and so are the `hf.co/` and
   `huggingface.co/` prefixes of Ollama's Hugging Face names.
2. A short name, `base[:tag]` without a `/`, names the one repository whose name is `base` or
   starts with `base` and then `-`, `_` or `.` (any case: `smollm2` is SmolLM2-135M-Instruct).
   A tag narrows it: a precision (`q4_1`) picks that variant, and a word of the repository's
   name (`135m`, `instruct`) must be one of its words. Two repositories left is ambiguous: a 404
   that names them, never a guess.
"""

from __future__ import annotations

import re

from gateway.models.store import ModelEntry, preference_key

_PREFIXES = ("hf.co/", "huggingface.co/")
_WORDS = re.compile(r"[-_.]")


def plain_name(name: str) -> str:
    """`name` without Ollama's `hf.co/` prefix and its `:latest` tag."""
    for prefix in _PREFIXES:
        if name.lower().startswith(prefix):
            name = name[len(prefix) :]
    return name[: -len(":latest")] if name.lower().endswith(":latest") else name


def short_matches(entries: list[ModelEntry], name: str) -> list[ModelEntry]:
    """The entries a short name `base[:tag]` can mean (rule 2), every variant of each repository."""
    base, _, tag = plain_name(name).partition(":")
    base, tag = base.casefold(), tag.casefold()
    if not base or "/" in base:
        return []
    out = []
    for e in entries:
        repo = e.repo.casefold()
        if repo != base and not (repo.startswith(base) and repo[len(base)] in "-_."):
            continue
        if tag and tag != e.precision.casefold() and tag not in _WORDS.split(repo):
            continue
        out.append(e)
    return out


def pick(matches: list[ModelEntry], name: str) -> ModelEntry | str:
    """The model a short name means, or why none: the repositories it could mean."""
    repos = sorted({f"{e.org}/{e.repo}" for e in matches})
    if len(repos) != 1:
        return f"it could name {', '.join(repos)}; use the full name" if repos else ""
    tag = plain_name(name).partition(":")[2].casefold()
    exact = [e for e in matches if e.precision.casefold() == tag]
    return exact[0] if exact else min(matches, key=lambda e: preference_key(e.precision, e.size))
