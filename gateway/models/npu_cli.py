"""`geniex npu plan MODEL`: whether a chat model fits a Snapdragon's NPU, and how it would be split,
before anything is converted or compiled (protocol/npu_plan.py does the arithmetic)."""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

import msgspec

from gateway.errors import GenieXError
from gateway.models.cli import human_size
from gateway.models.store import ModelStore
from gateway.ops.settings import add_data_dir, default_data_dir
from protocol import npu_plan
from protocol.gguf_header import npu_shape


def add_npu_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    npu = sub.add_parser("npu", help="chat models on a Snapdragon's NPU").add_subparsers(dest="npu", required=True)
    p = npu.add_parser("plan", help="how a model would be split for the NPU, and whether it fits, without building")
    p.add_argument("model", help="a model name (as `geniex list` shows it) or a GGUF file")
    p.add_argument("--soc", choices=sorted(npu_plan.SOCS), default=None,
                   help=f"the Snapdragon to plan for (default: this machine's, else {npu_plan.DEFAULT_SOC})")  # fmt: skip
    p.add_argument("--nctx", type=int, default=4096, help="context the KV cache is sized for (default 4096)")
    p.add_argument("--shared-weights", action="store_true",
                   help="plan for prefill and decode contexts sharing one copy of the weights (binaries built "
                        "offline on x86_64); by default each has its own, as when built on the device")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_data_dir(p)
    p.set_defaults(func=_plan)


def _gguf(name: str, data_dir: Path | None) -> str:
    if name.endswith(".gguf") and Path(name).is_file():
        return name
    entry = ModelStore(data_dir if data_dir is not None else default_data_dir()).resolve(name)
    if not entry.path.endswith(".gguf"):
        raise SystemExit(f"error: {entry.id} is not a GGUF chat model (engine {entry.engine})")
    return entry.path


def _plan(args: argparse.Namespace) -> int:
    if args.nctx < 1:
        raise SystemExit(f"error: --nctx must be 1 or more, not {args.nctx}")
    try:
        path = _gguf(args.model, args.data_dir)
        shape = npu_shape(path)
    except GenieXError as exc:
        raise SystemExit(f"error: {exc.message}") from None
    except (OSError, ValueError, struct.error, KeyError) as exc:  # a truncated or corrupt header
        raise SystemExit(f"error: {args.model}: not a readable GGUF header ({exc})") from None
    soc = npu_plan.SOCS[args.soc] if args.soc else npu_plan.detect_soc()[0]
    plan = npu_plan.plan(shape, soc, args.nctx, shared_weights=args.shared_weights)
    if args.json:
        sys.stdout.write(msgspec.json.encode(plan).decode() + "\n")
    else:
        print(f"{args.model} on the {soc.title} (HTP {soc.htp_arch}), nctx {args.nctx}")
        print(f"  {shape.params / 1e9:.2f} B parameters on the NPU, {human_size(plan.weight_bytes)} of weights "
              f"({plan.bytes_per_param:.2f} bytes per parameter; the token embedding stays on the host)")  # fmt: skip
        for i, part in enumerate(plan.parts):
            layers = f"layers {part.first_layer}-{part.end_layer - 1}" if part.end_layer > part.first_layer else ""
            what = ", ".join(x for x in (layers, "the head" if part.head else "") if x)
            print(f"  part {i}: {what}: {human_size(part.weight_bytes)}")
        copies = "shared by" if plan.shared_weights else "copied into each of"
        print(f"  largest context binary {human_size(plan.binary_bytes)} (limit {human_size(soc.binary_limit)}), "
              f"weights {copies} the prefill and decode contexts")  # fmt: skip
        print(
            f"  NPU memory {human_size(plan.process_bytes)} with the KV cache (limit about {human_size(soc.process_limit)})"
        )
        print("fits" if plan.fits else f"does not fit: {plan.why_not}")
    return 0 if plan.fits else 1
