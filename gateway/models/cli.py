"""`geniex pull | list | rm`: the model-management subcommands.

`gateway.cli` mounts them with `add_model_commands(subparsers)`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

from gateway.errors import GenieXError
from gateway.models.store import ModelEntry, ModelStore
from gateway.ops.settings import add_data_dir, default_data_dir

Command = Callable[[argparse.Namespace], int]


def add_model_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "pull", help="download a GGUF model from Hugging Face, or import a local GGUF, ONNX, Whisper or diffusers model"
    )
    p.add_argument("name", help="org/repo or org/repo:precision, e.g. bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M")
    p.add_argument(
        "--local",
        type=Path,
        metavar="PATH",
        help="import this GGUF file, ONNX model folder (model.onnx + tokenizer.json), CTranslate2 Whisper folder "
        "(model.bin + config.json + tokenizer.json) or diffusers pipeline folder (model_index.json), instead of "
        "downloading",
    )
    p.add_argument(
        "--mmproj",
        type=Path,
        metavar="PATH",
        help="with --local MODEL.gguf: the model's multimodal projector GGUF, imported with it (a vision model)",
    )
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


def _guarded(command: Command) -> Command:
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except GenieXError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            return 130

    run.__name__ = command.__name__
    return run


def _pull(args: argparse.Namespace) -> int:
    store = _store(args)
    if getattr(args, "mmproj", None) is not None and args.local is None:
        print("error: --mmproj goes with --local (a pull fetches the repo's projector itself)", file=sys.stderr)
        return 2
    if args.local is not None:
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


def human_size(n: int) -> str:
    """Decimal units, as disk sizes and the hub show them: 98362432 -> '98.4 MB'."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"
