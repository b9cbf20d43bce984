"""Server settings, each declared once: its field below carries its type, default, help, unit (in
its name) and which process reads it. `geniex serve`'s parser, its `GENIEX_*` reader
(gateway/cli.py), this struct, and docs/operating.md's table (`make docs`, gateway/cli_docs.py)
are all made from these declarations; the worker's own arguments are protocol/worker_args.py."""

from __future__ import annotations

import argparse
import functools
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from protocol import kv_cache, qnn
from protocol.power import ON_BATTERY_POLICIES
from protocol.worker_args import NPU_SPINNING

DEFAULT_HOST = "127.0.0.1:18181"


def add_data_dir(p: argparse.ArgumentParser) -> None:
    """`--data-dir` for the commands that read the store or the ledger. The default is resolved
    when the command runs, so GENIEX_DATA_DIR set after the parser is built still counts."""
    p.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                   help="default: $GENIEX_DATA_DIR, $GENIEX_DATADIR or ~/.cache/geniex")  # fmt: skip


def default_data_dir() -> Path:
    """GENIEX_DATA_DIR (the `--data-dir` flag's variable), GENIEX_DATADIR (GenieX's own name), or ~/.cache/geniex."""
    env = os.environ.get("GENIEX_DATA_DIR") or os.environ.get("GENIEX_DATADIR")
    return Path(env).expanduser() if env else Path("~/.cache/geniex").expanduser()


@dataclass(frozen=True)
class Flag:
    """How a Settings field is set from the command line and the environment."""

    help: str
    # Who reads it: the gateway, or also each worker (the pool passes it on in the worker's arguments).
    reads: Literal["gateway", "workers"] = "gateway"
    option: str = ""  # default: `--` and the field's name with dashes
    old: str = ""  # the option's former spelling, still read (flag and variable) for a release, with a warning
    choices: tuple[str, ...] = ()
    csv: bool = False  # a list given once, comma-separated (a list without it repeats the flag)
    lower: bool = False  # read in any case
    at_least: float | None = None
    at_most: float | None = None
    arg_default: Any = None  # the parser's default where the field's own is not one a user types


class Setting(typing.NamedTuple):
    """One declared setting, as the parser and the docs read it."""

    name: str  # the Settings field
    flag: Flag
    kind: type  # int, float, str, Path or bool; a list's element type
    is_list: bool
    default: Any  # the parser's default

    @property
    def option(self) -> str:
        return self.flag.option or "--" + self.name.replace("_", "-")


class Settings(msgspec.Struct, kw_only=True):
    host: Annotated[str, Flag("address to bind, `host`, `host:port` or `[v6]:port` (loopback by default)",
                              arg_default=DEFAULT_HOST)] = "127.0.0.1"  # fmt: skip
    port: int = 18181  # from --host
    ollama_port: Annotated[int, Flag(
        "also listen on this port, at the same address, for clients that assume Ollama's (11434 is Ollama's own; "
        "0: not); the same server, every API on both", at_least=0, at_most=65535)] = 0  # fmt: skip
    nctx: Annotated[int, Flag("context per request when the request has no `nctx`", "workers", at_least=1)] = 4096
    ngl: Annotated[int, Flag("GPU layers when the request has no `ngl` (-1 or 999: all)", "workers")] = -1
    compute: Annotated[str | None, Flag(
        "`cpu`, `gpu`, `npu`, `hybrid` (any case; anything else, from the flag or `GENIEX_COMPUTE`, stops the start); "
        "an unavailable unit falls back to CPU with a warning (by default the CPU)",
        "workers", choices=("cpu", "gpu", "npu", "hybrid"), lower=True)] = None  # fmt: skip
    compute_fallback: Annotated[bool, Flag(
        "refuse (400, with the reason) a request whose `compute` unit cannot be had, instead of running it on "
        "the CPU: an NPU model too large for the SoC, no NPU, a build without GPU offload "
        "(`GENIEX_NO_COMPUTE_FALLBACK=1`; one request asks the same with `GenieX-Compute-Fallback: false`)",
        "workers", option="--no-compute-fallback")] = True  # fmt: skip
    keep_alive_s: Annotated[float, Flag(
        "seconds an idle worker stays loaded (-1: forever, 0: stop after each request); a request's `keep_alive` "
        "overrides it for its model's worker", old="--keepalive")] = 300.0  # fmt: skip
    origins: Annotated[list[str], Flag(
        "comma-separated origins whose web pages may call the API (CORS, preflight included; every request header "
        "they ask for is allowed, `Retry-After` and `X-Request-Id` exposed); none by default, so no other site's "
        "page can read an answer", csv=True)] = []  # fmt: skip
    data_dir: Annotated[Path, Flag("model store and usage ledger (default `$GENIEX_DATADIR`, else `~/.cache/geniex`)")] = (
        msgspec.field(default_factory=default_data_dir))  # fmt: skip
    log_level: Annotated[str | None, Flag("`debug`, `info`, `warning`, `error` (default info)", "workers",
                                          choices=("debug", "info", "warning", "error"))] = None  # fmt: skip
    parallel: Annotated[int, Flag(
        "sequences one worker decodes at once (0: from nctx and the KV cache types, 4 at nctx ≤ 4096 in f16, fewer "
        "for longer contexts, about twice the context per slot in q8_0); set 8 to serve eight clients at once", "workers",
        at_least=0)] = 0  # fmt: skip
    max_queue: Annotated[int, Flag("requests waiting per worker before 503 + `Retry-After`", at_least=0)] = 16
    max_loaded: Annotated[int, Flag(
        "workers resident at once (0: as many as memory allows); the least recently used idle one is evicted "
        "first, a busy one never", at_least=0)] = 0  # fmt: skip
    memory_reserve_mb: Annotated[int, Flag("MiB of RAM to keep free when deciding whether another worker fits",
                                           old="--memory-reserve", at_least=0)] = 1024  # fmt: skip
    drain_timeout_s: Annotated[float, Flag(
        "seconds SIGTERM waits for requests in flight; meanwhile `/ready` answers 503 and new work is refused with "
        "503; those still running then end with 503 (an error event and `[DONE]` in a stream)",
        old="--drain-timeout")] = 30.0  # fmt: skip
    load_timeout_s: Annotated[float, Flag("seconds a worker may take to load its model", old="--load-timeout",
                                          at_least=0)] = 120.0  # fmt: skip
    preload: Annotated[list[str], Flag("comma-separated models to load before `/ready` turns 200", csv=True)] = []
    models_file: Annotated[Path | None, Flag(
        "a TOML file of per-model settings, one table per model id: aliases, request defaults (nctx, temperature, "
        "system, ...), keep_alive, preload, parallel, KV cache types, hidden, disabled (docs/models.md, \"Per-model "
        "settings\"). Read again on SIGHUP and when it changes on disk; an invalid version keeps the one before "
        "(logged), and an invalid file at startup stops the start")] = None  # fmt: skip
    threads: Annotated[int, Flag(
        "threads per worker (0: the physical cores); busy workers share the cores, and a worker uses fewer while "
        "other programs keep cores busy", "workers", at_least=0)] = 0  # fmt: skip
    crash_limit: Annotated[int, Flag(
        "crashes within `--crash-window-s` after which a model is refused (503) for `--crash-backoff-s` seconds "
        "(0: never)", at_least=0)] = 3  # fmt: skip
    crash_window_s: Annotated[float, Flag("seconds, see `--crash-limit`", old="--crash-window", at_least=0)] = 60.0
    crash_backoff_s: Annotated[float, Flag("seconds, see `--crash-limit`", old="--crash-backoff", at_least=0)] = 30.0
    hang_silence_s: Annotated[float, Flag(
        "seconds a worker with requests in flight may send nothing, not even its once-a-second heartbeat (a stopped "
        "or deadlocked process), before it is hung: its requests fail naming it, it is killed and restarted by the "
        "next request (a crash, as `--crash-limit` counts). 0: never", at_least=0)] = 15.0  # fmt: skip
    hang_step_s: Annotated[float, Flag(
        "seconds one engine step may run (a decode batch, a prompt chunk of 512 tokens) before its worker is hung; "
        "0: each engine's own bound (protocol/engines.py: 300 for llama.cpp)", at_least=0)] = 0.0  # fmt: skip
    request_timeout_s: Annotated[float, Flag(
        "seconds a request may take in all, its wait for a worker included (0: no limit; a key-file `timeout=N` "
        "sets one per key). Past it the request is cancelled on its worker: a 504 before the first byte, an error "
        "event (then `[DONE]`) in a stream; billed as cancelled. Pulls and /v1/events are not limited",
        at_least=0)] = 0.0  # fmt: skip
    stream_interval_ms: Annotated[int, Flag(
        "ms: tokens generated closer together than this go out in one chunk (the first token always at once; 0: a "
        "chunk per token). With N sequences decoding at once a stream's interval is N × this, so the chunks a "
        "worker sends per second stay about level under load (4 streams: client + gateway CPU per token 0.95 → "
        "0.42 ms)", "workers", old="--stream-interval", at_least=0)] = 20  # fmt: skip
    sse_ping_interval_s: Annotated[float, Flag(
        "seconds a stream may go without sending anything before it sends a keep-alive, so a client or proxy "
        "reading with a timeout does not give up on a long prompt's prefill (or an MCP tool's run between "
        "Responses rounds): an SSE comment line `: keep-alive` on the OpenAI streams, an `event: ping` on "
        "`/v1/messages`, a line with no text on Ollama's (docs/operating.md). 0: never; under 0.1 counts as 0.1",
        at_least=0, at_most=3600)] = 15.0  # fmt: skip
    worker_nice: Annotated[int, Flag(
        "added to the workers' nice value. At 0 they run at the gateway's priority. A higher value buys a little "
        "`/health` latency on an idle box (p99 with 4 streams: 6.8 ms at 0, 3.5 ms at 10) and gives every other "
        "busy program about ten times the worker's CPU share: with one busy process beside it, 50 tokens took "
        "151 s at nice 10 before the thread governor", "workers", at_least=0, at_most=19)] = 0  # fmt: skip
    cache_ram_mb: Annotated[int, Flag(
        "MiB of host RAM per chat worker for saved prompt states (0: only what the slots hold); counted in the "
        "memory a worker needs", "workers", old="--cache-ram", at_least=0)] = 1024  # fmt: skip
    cache_disk_mb: Annotated[int, Flag(
        "MiB of disk, in the data dir's prompt-cache/, for prompt states a chat worker would lose (the RAM tier "
        "evicting them, an idle stop, an eviction, a restart): a later request of the same tenant restores its "
        "prefix instead of prefilling it; least recently used go first, GenieX-KeepCache ones last (0: off)",
        "workers", option="--cache-disk", at_least=0, at_most=1 << 24)] = 4096  # fmt: skip
    cache_type_k: Annotated[str, Flag(
        "the type a chat worker's KV cache keeps keys in (llama-server's `-ctk`; default f16): `q8_0` takes about "
        "half of f16's memory, `q4_0` and `iq4_nl` about a quarter, so a worker holds a longer context (or, with "
        "`--parallel 0`, more slots) in the same RAM at a small cost in accuracy; also `f32`, `bf16`, `q4_1`, "
        "`q5_0`, `q5_1`. Its draft models follow it; embedding workers keep f16",
        "workers", choices=tuple(kv_cache.KV_TYPES), lower=True)] = kv_cache.DEFAULT  # fmt: skip
    cache_type_v: Annotated[str, Flag(
        "the same for the cache's values (`-ctv`); a quantized type turns flash attention on, without which "
        "llama.cpp cannot store V quantized",
        "workers", choices=tuple(kv_cache.KV_TYPES), lower=True)] = kv_cache.DEFAULT  # fmt: skip
    api_keys: Annotated[list[str], Flag(
        "a key every API request must send (`Authorization: Bearer KEY` or `x-api-key: KEY`; repeatable); without "
        "any key the server answers everyone who can connect", option="--api-key")] = []  # fmt: skip
    api_key_file: Annotated[Path | None, Flag(
        "keys, one per line, an optional label and optional limits after each (`KEY LABEL rpm=60 tpm=20000 "
        "concurrent=2`, `#` comments); read again on SIGHUP. The ledger, the logs and the prompt cache know a "
        "caller by the label (or a hash of the key), never by the key. Over a limit: 429 with `Retry-After`, "
        "naming the limit; `rpm`/`tpm` are sliding minutes (tokens are prompt plus completion, counted as a "
        "request ends), `concurrent` counts requests in flight; per-key series in `/metrics` (`geniex:key_*`). "
        "`manage=yes` lets a key pull, copy and delete models over HTTP (`--api-key` keys may); `mcp=a,b` names "
        "the MCP servers of `--mcp-config` it may use (`mcp=*`: all; `--api-key` keys use all)")] = None  # fmt: skip
    metrics_key: Annotated[bool, Flag("`/metrics` needs a key too (`/health` and `/ready` never do)")] = False
    insecure_no_auth: Annotated[bool, Flag(
        "bind an address other machines can reach without any API key (refused otherwise; logged loudly)")] = False  # fmt: skip
    certfile: Annotated[Path | None, Flag(
        "serve HTTPS with this PEM certificate (chain); needs `--keyfile`. A pair that does not load stops the "
        "start with one line")] = None  # fmt: skip
    keyfile: Annotated[Path | None, Flag("the certificate's PEM private key")] = None
    max_connections: Annotated[int, Flag(
        "requests served at once (health probes aside); beyond it a request gets a JSON 503 with `Retry-After` at "
        "once rather than queueing without bound, and connections beyond twice this are refused", at_least=1)] = 512  # fmt: skip
    max_body_mb: Annotated[int, Flag(
        "MiB a request body may hold (images and audio travel inside it); a larger one is a 413, refused without "
        "reading the rest. A WebSocket message (`/v1/realtime`) too: a larger one closes its connection (1009)",
        old="--max-body", at_least=1)] = 32  # fmt: skip
    max_nctx: Annotated[int, Flag(
        "the largest `nctx` a request may ask for; 0: the context each model was trained for (its GGUF says), so "
        "`nctx` beyond it is a 400", at_least=0)] = 0  # fmt: skip
    truncation: Annotated[str, Flag(
        "what a chat conversation (chat completions, `/v1/messages`, `/v1/responses`) longer than the context gets "
        "when its request has no `truncation`: `disabled`, a 400 `context_length_exceeded`; `auto`, its oldest "
        "turns after the leading system messages are dropped until it fits with room for the answer, and the "
        "answer says how many (docs/api.md)", choices=("disabled", "auto"), lower=True)] = "disabled"  # fmt: skip
    reasoning_budget: Annotated[int, Flag(
        "the most tokens a model's thinking section (`<think>`) may take when the request sets no budget of its "
        "own (`reasoning_effort`, `thinking_budget_tokens`, Anthropic's `thinking`, Ollama's `think`): then the "
        "engine closes it and the answer follows; -1: unlimited, 0: no thinking (docs/api.md#reasoning-budgets)",
        at_least=-1, at_most=1 << 20)] = -1  # fmt: skip
    allowed_hosts: Annotated[list[str], Flag(
        "a `Host` name the server answers to besides loopback names and the address it binds (repeatable, "
        "`GENIEX_ALLOWED_HOST` takes a `:`-separated list; `*` for any); any other gets 403, a defence against "
        "DNS rebinding", option="--allowed-host")] = []  # fmt: skip
    fetch_hosts: Annotated[list[str], Flag(
        "a host whose http(s) URLs requests may name for images and audio (`/v1/cv`, `/v1/audio/diarize`; "
        "repeatable). Off by default: fetching on a client's behalf is a server-side request forgery risk. "
        "Redirects are not followed; the size is bounded by `--max-body-mb` and the time by 10 s",
        option="--fetch-host")] = []  # fmt: skip
    media_dirs: Annotated[list[Path], Flag(
        "a folder whose images chat requests may name by local path or `file://` URL (repeatable; "
        "`GENIEX_MEDIA_DIR` takes a `:`-separated list); symlinks are resolved before the check",
        option="--media-dir")] = []  # fmt: skip
    grammar_dirs: Annotated[list[Path], Flag(
        "a folder `grammar_path` may read GBNF files from (repeatable; `GENIEX_GRAMMAR_DIR` takes a `:`-separated "
        "list)", option="--grammar-dir")] = []  # fmt: skip
    mcp_config: Annotated[Path | None, Flag(
        "a JSON file of the MCP servers the Responses API's `mcp` tool may use, in the desktop assistants' format: "
        "`{\"mcpServers\": {\"name\": {\"command\", \"args\", \"env\"} or {\"url\", \"headers\"}}}` "
        "(docs/mcp.md). A stdio server starts on first use, with only the config's environment; a request names a "
        "server by its name only; key-file keys use the servers their `mcp=` gives")] = None  # fmt: skip
    mcp_call_timeout_s: Annotated[float, Flag(
        "seconds one MCP tool call (or tool listing, or a server's start) may take, its wait for a free slot "
        "included; past it the call ends as failed and the model reads why", at_least=0.1)] = 60.0  # fmt: skip
    mcp_max_result_kb: Annotated[int, Flag(
        "KiB of text an MCP tool's result may hold; a larger one ends its call as failed, so the model never "
        "reads more", at_least=1)] = 256  # fmt: skip
    mcp_max_calls: Annotated[int, Flag(
        "MCP tool calls the server runs for one response, over all its rounds (a request's `max_tool_calls` may "
        "set fewer); then the model answers without tools", at_least=1)] = 16  # fmt: skip
    mcp_concurrency: Annotated[int, Flag(
        "calls one MCP server runs at once, over all requests; more wait their turn (within "
        "`--mcp-call-timeout-s`)", at_least=1)] = 4  # fmt: skip
    realtime_sessions_per_key: Annotated[int, Flag(
        "`/v1/realtime` sessions one API key (or, without keys, all clients together) may hold open at once; "
        "one more is refused with an `error` event", at_least=1)] = 4  # fmt: skip
    realtime_max_session_s: Annotated[float, Flag(
        "seconds one `/v1/realtime` session may last; then it ends with an `error` event (OpenAI's sessions "
        "last 60 minutes)", at_least=1)] = 3600.0  # fmt: skip
    realtime_idle_s: Annotated[float, Flag(
        "seconds a `/v1/realtime` session may go without a client event while no response runs; then it ends "
        "with an `error` event", at_least=1)] = 600.0  # fmt: skip
    responses_store_max: Annotated[int, Flag(
        "`/v1/responses` answers kept (`store: true`, the default) per API key (without keys, for all callers "
        "together), in the data dir's responses.sqlite3; past it the key's oldest finished one is evicted, "
        "logged, and named in the `GenieX-Evicted-Responses` header of the request that evicted it",
        at_least=1)] = 1000  # fmt: skip
    responses_store_mb: Annotated[int, Flag(
        "MiB the kept responses of one API key may take (each with its conversation, input items and a background "
        "response's stream events); past it its oldest finished ones are evicted the same way", at_least=1)] = 256  # fmt: skip
    responses_background_per_key: Annotated[int, Flag(
        "`background: true` responses one API key may have queued or running at once; one more is a 429",
        at_least=1)] = 4  # fmt: skip
    responses_background_max: Annotated[int, Flag(
        "`background: true` responses queued or running at once, all keys together; one more is a 429 (each "
        "also counts as a request in flight for `--max-connections` and the drain)", at_least=1)] = 16  # fmt: skip
    responses_events_mb: Annotated[int, Flag(
        "MiB of stream events a background response keeps for replay (`GET /v1/responses/{id}?stream=true`); "
        "past it the events in between are not kept, its last one always is", at_least=1, at_most=1024)] = 8  # fmt: skip
    conversations_store_max: Annotated[int, Flag(
        "conversations (`/v1/conversations`) kept per API key; past it the one least recently added to is "
        "evicted, logged and named in the `GenieX-Evicted-Conversations` header", at_least=1)] = 1000  # fmt: skip
    conversations_store_mb: Annotated[int, Flag(
        "MiB the conversations' items of one API key may take; past it the least recently added to are evicted, "
        "and a conversation that alone would exceed it refuses more items (400)", at_least=1)] = 256  # fmt: skip
    webui: Annotated[bool, Flag(
        "serve no web UI (`/`, `/voice`, `/ops`, `/try`, `/docs`) and no `/openapi.json` (`GENIEX_NO_WEBUI=1`)",
        option="--no-webui")] = True  # fmt: skip
    npu_performance: Annotated[str, Flag(
        "the NPU's performance mode (QNN's HTP voltage and clock votes): `auto` is `burst` on mains power and "
        "`balanced` on battery, as the power supply says when a worker starts; `sustained_high_performance` "
        "suits long plugged-in runs, the `*power_saver` modes a laptop that must last (docs/accelerators.md)",
        "workers", choices=qnn.PERFORMANCE_MODES)] = "auto"  # fmt: skip
    npu_spinning: Annotated[str, Flag(
        "whether onnxruntime's threads in the NPU's (QNN) sessions spin, busy-waiting for work, instead of "
        "sleeping: `off` (the default; workers share the cores with each other and with the rest of a laptop, "
        "and with QNN spinning took 62-66 percent of 12 cores during NPU decode against 9-14 percent without, "
        "microsoft/Foundry-Local#1081, for a little decode speed), `mains` (spin on mains power, never on "
        "battery, as the power supply says when a worker starts), `on` (always: a plugged-in machine serving "
        "nothing else). Measured on the CPU EP, spinning made short steps 16-18 percent faster on an idle box and "
        "39-41 percent slower beside one busy process (bench/README.md). CPU sessions never spin",
        "workers", choices=NPU_SPINNING)] = "off"  # fmt: skip
    on_battery: Annotated[str, Flag(
        "what changes while the laptop runs from its battery, applied when the power source changes (read "
        "every 5 s, logged, shown in /v1/workers): `cap-threads` (CPU workers decode with at most half the "
        "cores), `prefer-npu` (a request that names no `compute` unit asks for the NPU, falling back as usual), "
        "`none` (the default: nothing)",
        choices=ON_BATTERY_POLICIES)] = "none"  # fmt: skip
    qnn_simulator: Annotated[bool, Flag(
        "on x86_64, let `compute: npu` use Qualcomm's HTP simulator (slow: development and tests only; see "
        "docs/accelerators.md). Without it, where there is no NPU, `npu` falls back to the CPU with a warning",
        "workers")] = False  # fmt: skip


@functools.cache
def declared() -> tuple[Setting, ...]:
    """Every field that carries a Flag, in declaration order."""
    hints = typing.get_type_hints(Settings, include_extras=True)
    out = []
    for field in msgspec.structs.fields(Settings):
        hint = hints[field.name]
        if typing.get_origin(hint) is not Annotated:
            continue
        base, flag = typing.get_args(hint)[:2]
        is_list = typing.get_origin(base) is list
        kind = typing.get_args(base)[0] if is_list else _without_none(base)
        default = flag.arg_default
        if default is None and field.default is not msgspec.NODEFAULT:
            default = list(field.default) if is_list else field.default
        out.append(Setting(field.name, flag, kind, is_list, default))
    return tuple(out)


def _without_none(hint: Any) -> type:
    if isinstance(hint, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return typing.cast(type, hint)


def out_of_bounds(settings: Settings) -> list[str]:
    """Each setting whose value its declaration's bounds refuse, as one line naming the flag."""
    out = []
    for s in declared():
        value = getattr(settings, s.name)
        low, high = s.flag.at_least, s.flag.at_most
        if (low is not None and value < low) or (high is not None and value > high):
            bound = f"{_num(low)}..{_num(high)}" if low is not None and high is not None else f"{_num(low)} or more"
            out.append(f"{s.option} must be {bound}, not {_num(value)}")
    return out


def _num(x: float | None) -> str:
    """A bound as a person writes it: 1048576, not 1.04858e+06."""
    return str(int(x)) if x is not None and x == int(x) else f"{x:g}"


def split_host(value: str) -> tuple[str, int]:
    """`host:port`, `host` or `:port`; IPv6 as `[::1]:port`."""
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        return host, int(rest.lstrip(":") or 18181)
    if value.count(":") == 1:
        host, port = value.split(":")
        return host or "127.0.0.1", int(port)
    return value, 18181
