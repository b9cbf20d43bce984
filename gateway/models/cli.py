"""`geniex pull | list | rm`: the model-management subcommands.

`gateway.cli` mounts them with `add_model_commands(subparsers)`.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from gateway.errors import BadRequest, GenieXError
from gateway.models.sizes import human_size
from gateway.models.store import ModelEntry, ModelStore
from gateway.ops.settings import add_data_dir, default_data_dir
from protocol.npu_bundle import BUNDLE_FILE
from protocol.upstream import UpstreamError, UpstreamSpec, validate

Command = Callable[[argparse.Namespace], int]


def add_model_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "pull",
        help="download a GGUF model from Hugging Face, or import a local GGUF, ONNX, Whisper, diffusers or Genie model",
    )
    p.add_argument("name", help="org/repo or org/repo:precision, e.g. bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M")
    p.add_argument(
        "--local",
        type=Path,
        metavar="PATH",
        help="import this GGUF file, NPU bundle (`geniex npu compile --bundle`), Genie bundle from Qualcomm AI Hub "
        "(genie_config.json + tokenizer.json + QNN context binaries), ONNX model folder (model.onnx + "
        "tokenizer.json), CTranslate2 Whisper folder (model.bin + config.json + tokenizer.json) or diffusers "
        "pipeline folder (model_index.json), instead of downloading",
    )
    p.add_argument(
        "--mmproj",
        type=Path,
        metavar="PATH",
        help="with --local MODEL.gguf: the model's multimodal projector GGUF, imported with it (a vision model)",
    )
    up = p.add_argument_group("a model served elsewhere (an OpenAI-compatible server: vLLM, Ray Serve LLM, ...)")
    up.add_argument("--upstream", metavar="URL", help="register NAME as served by this /v1 root, e.g. "
                    "http://gpu-box:8000/v1 (nothing is downloaded)")  # fmt: skip
    up.add_argument("--upstream-model", metavar="NAME", help="the model's name on the upstream (default: NAME)")
    up.add_argument("--upstream-key-env", metavar="VAR",
                    help="the environment variable (of the server) holding the upstream's API key")  # fmt: skip
    up.add_argument("--upstream-key-file", metavar="PATH", type=Path, help="a file holding the upstream's API key")
    up.add_argument("--upstream-capabilities", metavar="LIST",
                    help="comma-separated: chat, completions, embeddings, rerank (default: chat,completions)")  # fmt: skip
    up.add_argument("--upstream-timeout", metavar="S", type=float,
                    help="seconds the upstream may stay silent before a 504 (default 120)")  # fmt: skip
    up.add_argument("--upstream-connect-timeout", metavar="S", type=float, help="seconds to connect (default 5)")
    up.add_argument("--upstream-concurrency", metavar="N", type=int,
                    help="requests sent to the upstream at once (default 32)")  # fmt: skip
    up.add_argument("--upstream-config", metavar="FILE", type=Path,
                    help="a JSON file with the same settings (base_url, model, api_key_env | api_key_file, "
                         "capabilities, connect_timeout, read_timeout, max_concurrency, probe_interval, "
                         "rerank_path, context_length); flags override it")  # fmt: skip
    add_data_dir(p)
    p.set_defaults(func=_guarded(_pull))

    p = sub.add_parser("list", help="list the models available locally")
    p.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    add_data_dir(p)
    p.set_defaults(func=_guarded(_list))

    p = sub.add_parser("rm", help="remove a model variant (org/repo:precision) or every variant (org/repo)")
    p.add_argument("name")
    add_data_dir(p)
    p.set_defaults(func=_guarded(_rm))


def _store(args: argparse.Namespace) -> ModelStore:
    return ModelStore(args.data_dir if args.data_dir is not None else default_data_dir())


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP: unwound like Ctrl-C (huggingface_hub aborts a xet download on a
    KeyboardInterrupt too), then the exit status the signal would have given."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, _frame: object) -> None:
    raise Stopped(signum)


def stop_on_signals() -> None:
    """Ctrl-C, a kill and a closed terminal each stop the command through its `finally`s (a pull's
    removes its staging folder), whatever this process inherited. A shell script's background job
    and some launchers (CI runners among them) start their children with SIGINT ignored; Python
    then raises no KeyboardInterrupt at all, and an interrupted pull ran to its end and exited 0.
    These commands run in the foreground: a signal sent to one is meant for it."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _stop)
    if hasattr(signal, "SIGHUP"):  # not on Windows
        signal.signal(signal.SIGHUP, _stop)


def _guarded(command: Command) -> Command:
    def run(args: argparse.Namespace) -> int:
        stop_on_signals()
        try:
            return command(args)
        except GenieXError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            return 1
        except Stopped as exc:
            print(f"error: stopped by {exc}", file=sys.stderr)
            return 128 + exc.signum
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            return 130

    run.__name__ = command.__name__
    return run


def upstream_spec(args: argparse.Namespace) -> UpstreamSpec:
    """The descriptor `pull --upstream` registers: the config file's settings, then the flags'."""
    fields: dict[str, Any] = {}
    if args.upstream_config is not None:
        try:
            loaded = msgspec.json.decode(args.upstream_config.read_bytes())
        except (OSError, msgspec.DecodeError) as exc:
            raise BadRequest(f"--upstream-config {args.upstream_config}: {exc}") from None
        if not isinstance(loaded, dict):
            raise BadRequest(f"--upstream-config {args.upstream_config}: expected a JSON object")
        fields.update(loaded)
    flags = {"base_url": args.upstream, "model": args.upstream_model, "api_key_env": args.upstream_key_env,
             "api_key_file": str(args.upstream_key_file.expanduser().absolute()) if args.upstream_key_file else None,
             "connect_timeout": args.upstream_connect_timeout, "read_timeout": args.upstream_timeout,
             "max_concurrency": args.upstream_concurrency,
             "capabilities": args.upstream_capabilities.split(",") if args.upstream_capabilities else None}  # fmt: skip
    fields.update({k: v for k, v in flags.items() if v is not None})
    fields.setdefault("model", args.name.split(":")[0])
    if "base_url" not in fields:
        raise BadRequest("--upstream URL (or base_url in --upstream-config) is required")
    try:
        return validate(msgspec.convert(fields, UpstreamSpec))
    except msgspec.ValidationError as exc:
        raise BadRequest(f"upstream settings: {exc}") from None
    except UpstreamError as exc:
        raise BadRequest(str(exc)) from None


def _pull(args: argparse.Namespace) -> int:
    store = _store(args)
    if getattr(args, "mmproj", None) is not None and args.local is None:
        print("error: --mmproj goes with --local (a pull fetches the repo's projector itself)", file=sys.stderr)
        return 2
    if args.upstream is not None or args.upstream_config is not None:
        if args.local is not None:
            raise BadRequest("--local and --upstream: one or the other")
        entry = store.add_upstream(args.name, upstream_spec(args))
        print(entry.id)
        return 0
    if args.local is not None and (Path(args.local) / BUNDLE_FILE).is_file():
        from gateway.models.npu_cli import import_bundle

        entry = import_bundle(store, Path(args.local), args.name)  # a model compiled for the NPU elsewhere
    elif args.local is not None:
        entry = store.import_local(args.local, args.name, mmproj=getattr(args, "mmproj", None))
    else:
        from gateway.models.pull import (
            pull,  # huggingface_hub is slow to import; `list`/`rm` don't need it
        )

        entry = pull(store, args.name, progress=True)
    print(entry.id)
    return 0


def _list(args: argparse.Namespace) -> int:
    entries = _store(args).entries()
    if args.json:
        print(msgspec.json.encode(entries).decode())
        return 0
    rows = [("ID", "SIZE", "ENGINE", "SOURCE")] + [
        (e.id, human_size(e.size), e.engine, "bundled" if e.bundled else "pulled") for e in entries
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def _rm(args: argparse.Namespace) -> int:
    removed: list[ModelEntry] = _store(args).remove(args.name)
    for entry in removed:
        print(f"removed {entry.id}")
    return 0
