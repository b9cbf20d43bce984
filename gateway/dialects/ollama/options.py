"""Ollama's `options` and `keep_alive`, read into the chat request's own fields.

Every option Ollama defines is known here: those this server honours map to a chat field (and so
meet the same bounds as on `/v1/chat/completions`); those it cannot (thread counts, mmap, mirostat
…) are named in the request's log line, never dropped silently. A name Ollama does not define is
ignored and named there too, as Ollama ignores it with a warning: clients put their own settings
in `options` (Open WebUI passes a model's `reasoning_effort`, `logit_bias` and custom parameters
through), and refusing them would refuse the client that Ollama serves.
"""

from __future__ import annotations

import math
import re
from typing import Any

import structlog

from gateway.errors import BadRequest
from protocol.limits import INT32_MAX, MAX_KEEP_ALIVE_S, MAX_STOP

log = structlog.get_logger("gateway.ollama")

# Ollama's option -> the chat request's field. num_predict's -1 (no limit) and -2 (fill the
# context) both mean "until the context is full", which is the server's own limit.
_MAPPED = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "stop": "stop",
    "num_predict": "max_tokens",
    "num_ctx": "nctx",
    "num_gpu": "ngl",  # layers on the GPU, as llama.cpp's -ngl
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
# Read but not honoured: the server decides these per worker (threads, batch, memory mapping,
# which GPU), or its sampler has no such stage (tfs_z, typical_p, mirostat).
_IGNORED = frozenset({
    "numa", "num_batch", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mmap", "use_mlock",
    "embedding_only", "num_thread", "num_keep", "tfs_z", "typical_p", "repeat_last_n", "mirostat", "mirostat_tau",
    "mirostat_eta", "penalize_newline",
})  # fmt: skip
_NUMBER = (int, float)
_MAX_NAMED = 16


def _number(name: str, value: Any, *, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, _NUMBER) or (integer and not isinstance(value, int)):
        raise BadRequest(f"`options.{name}`: expected {'an integer' if integer else 'a number'}")
    if not math.isfinite(value):
        raise BadRequest(f"`options.{name}`: expected a finite number")
    return value


def chat_fields(options: dict[str, Any] | None) -> dict[str, Any]:
    """The chat request's fields that `options` sets (checked further by the chat request's own types)."""
    if not options:
        return {}
    out: dict[str, Any] = {}
    ignored: list[str] = []  # Ollama's, which this server does not run
    unknown: list[str] = []  # not Ollama's at all
    for name, value in options.items():
        if name in _IGNORED:
            ignored.append(name)
            continue
        field = _MAPPED.get(name)
        if field is None:
            unknown.append(name[:64])
            continue
        if value is None:
            continue
        if name == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                raise BadRequest("`options.stop`: expected a string or a list of strings")
            if len(stops) > MAX_STOP:
                raise BadRequest(f"`options.stop`: at most {MAX_STOP} stop strings")
            out[field] = stops
            continue
        integer = name in ("top_k", "seed", "num_predict", "num_ctx", "num_gpu")
        number = _number(name, value, integer=integer)
        if name == "num_predict" and number < 0:
            continue
        if integer and not -INT32_MAX <= number <= INT32_MAX and name != "seed":
            raise BadRequest(f"`options.{name}`: {number} is out of range")
        if name == "num_ctx" and number < 1:
            raise BadRequest("`options.num_ctx`: at least 1")
        if name == "num_gpu" and number < 0:
            continue  # Ollama's -1: its own choice, as our default is
        out[field] = number
    if ignored or unknown:
        # The log is told at most _MAX_NAMED unknown names: a body can hold thousands.
        log.info("Ollama options not honoured by this server", options=sorted(ignored),
                 not_ollamas=sorted(unknown)[:_MAX_NAMED] or None)  # fmt: skip
    return out


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_SECONDS = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_s(value: float | str | None) -> float | None:
    """`keep_alive` in seconds (-1: never unloaded for idleness; 0: unloaded once the answer is done).

    A number is seconds; a string is a number of seconds or a Go duration ("5m", "1h30m", "-1m");
    any negative value pins the model, as in Ollama. Longer than a week is refused (--keep-alive-s's
    own bound), rather than cut silently."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        parts = _DURATION.findall(body)
        if _SECONDS.fullmatch(body):
            seconds = float(body)
        elif body and "".join(n + u for n, u in parts) == body:
            seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
        else:
            raise BadRequest(f'`keep_alive`: {value[:40]!r} is not a duration (e.g. "5m", "1h30m", 300, -1)')
        seconds *= sign
    elif isinstance(value, bool):
        raise BadRequest("`keep_alive`: expected a number of seconds or a duration")
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise BadRequest("`keep_alive`: expected a finite duration")
    if seconds < 0:
        return -1.0
    if seconds > MAX_KEEP_ALIVE_S:
        raise BadRequest(f"`keep_alive`: at most {MAX_KEEP_ALIVE_S // 3600} hours (or -1: never unloaded)")
    return seconds
