"""What a pull route accepts as a model name, and when two pulls are the same one.

Clients name a Hugging Face GGUF repository as GenieX does (`org/repo[:precision]`) or as Ollama
does (`hf.co/org/repo:QUANT`, also `huggingface.co/...`; the tag `latest` means "the preferred
precision", as a name without a tag does). Ollama's own library names (`llama3.2`) have no
Hugging Face repository behind them, so they are refused with the form to use instead. The store's
`parse_name` has the last word on what a name may contain, so no name can reach outside the store.
"""

from __future__ import annotations

from gateway.errors import BadRequest
from gateway.models.store import parse_name

HF_PREFIXES = ("hf.co/", "huggingface.co/")
LATEST = ":latest"
EXAMPLE = "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"
FORMS = f"org/repo[:QUANT] or hf.co/org/repo:QUANT (for example {EXAMPLE})"


def pull_name(raw: str) -> str:
    """`raw` as `org/repo[:precision]`, or a BadRequest saying which forms are taken."""
    name = raw.strip()
    if not name:
        raise BadRequest(f"`model` is required: a Hugging Face GGUF repository, {FORMS}")
    if any(ord(c) < 0x20 or c == "\x7f" for c in name):
        raise BadRequest("invalid model name: it holds control characters")
    if "://" in name:
        raise BadRequest(f"invalid model name: a pull takes a repository name, not a URL; {FORMS}")
    for prefix in HF_PREFIXES:
        if name.lower().startswith(prefix):
            name = name[len(prefix) :]
            break
    if name.lower().endswith(LATEST):
        name = name[: -len(LATEST)]
    if "/" not in name:
        raise BadRequest(
            f"{name.partition(':')[0]!r} is an Ollama library name; GenieX pulls only Hugging Face GGUF "
            f"repositories: name one as {FORMS}"
        )
    org, repo, precision = parse_name(name, BadRequest)
    return f"{org}/{repo}" + (f":{precision}" if precision else "")


def pull_key(name: str) -> str:
    """The one running download that every pull of `name` (a `pull_name`) shares: precisions are
    matched without regard to case, as the store matches them; org and repo are kept as given,
    as they are the folder names the store writes."""
    org, repo, precision = parse_name(name, BadRequest)
    return f"{org}/{repo}:{(precision or '').upper()}"
