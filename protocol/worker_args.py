"""A worker's arguments, declared once: the gateway writes them as the worker's command line
(`argv`) and the worker reads them back (`parse`), so a new one is one field here."""

from __future__ import annotations

import msgspec

# `--npu-spinning`: whether onnxruntime's thread pools in QNN sessions spin between tasks (gateway/ops/settings.py
# says why `off` is the default); `mains` is resolved by the worker as it starts, from the power supply.
NPU_SPINNING = ("off", "mains", "on")


class WorkerArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    engine: str  # a name in workers/engines ENGINES (and protocol/engines.py)
    model_path: str
    compute: str = "cpu"
    nctx: int = 4096
    ngl: int = 0
    parallel: int = 0  # 0: the engine chooses from nctx
    threads: int = 0  # 0: the physical cores
    stream_interval_ms: int = 0  # 0: send each token's text as it comes
    nice: int = 0  # added to the process's nice value before any thread starts
    batch_tokens: int = 0  # an embedding engine's tokens per decode (0: its default)
    cache_ram_mb: int = 0  # the chat engine's prompt cache in host RAM (0: none)
    cache_disk_mb: int = 0  # ... and on disk, under it (0: none)
    prompt_cache_dir: str = ""  # where the disk tier keeps its files ("": none)
    cache_dir: str = ""  # the NPU chat engine's converted graphs ("": the default data dir's npu/)
    mmproj: str = ""  # the chat engine's multimodal projector GGUF ("": none)
    npu_performance: str = "auto"  # QNN's HTP performance mode (protocol/qnn.py PERFORMANCE_MODES)
    npu_spinning: str = "off"  # whether QNN sessions' thread pools spin (NPU_SPINNING)
    # The llama.cpp chat engine's KV cache types (protocol/kv_cache.py KV_TYPES), for its draft models too.
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    name: str = "worker"  # in its log lines
    log_level: str = "info"
    # Set by the gateway as it starts the process: the two ZeroMQ endpoints and its own pid.
    inbox: str = ""
    outbox: str = ""
    parent_pid: int = 0


def argv(args: WorkerArgs) -> list[str]:
    """`--field-name value` for every field (plain values: readable in `ps`)."""
    out: list[str] = []
    for field in msgspec.structs.fields(WorkerArgs):
        out += ["--" + field.name.replace("_", "-"), str(getattr(args, field.name))]
    return out


def parse(command_line: list[str]) -> WorkerArgs:
    """The inverse of `argv`; an unknown or malformed argument is a ValueError naming it."""
    if len(command_line) % 2:
        raise ValueError(f"arguments come in `--name value` pairs: {command_line!r}")
    values: dict[str, str] = {}
    for option, value in zip(command_line[::2], command_line[1::2], strict=True):
        if not option.startswith("--"):
            raise ValueError(f"expected an option, got {option!r}")
        values[option[2:].replace("-", "_")] = value
    try:
        return msgspec.convert(values, WorkerArgs, strict=False)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None
