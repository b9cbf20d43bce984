"""`geniex npu plan MODEL`: whether a chat model fits a Snapdragon's NPU, and how it would be split,
before anything is converted or compiled (protocol/npu_plan.py does the arithmetic).
`geniex npu compile MODEL`: convert and compile it now, into the data dir's NPU cache, and optionally
as a bundle for another machine; `geniex pull NAME --local BUNDLE` imports one (`import_bundle`)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec

from gateway.errors import BadRequest, GenieXError
from gateway.models.sizes import human_size
from gateway.models.store import ModelEntry, ModelStore
from gateway.ops.settings import add_data_dir, default_data_dir
from protocol import npu_plan
from protocol.gguf_header import npu_shape
from protocol.npu_cache import CONFIG_FILE, CONVERTER_VERSION, NPU_DIR, cache_key


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
    c = npu.add_parser("compile", help="convert a model and compile its NPU graphs now (a first NPU load then "
                       "takes about a second), here or as a bundle for another machine")  # fmt: skip
    c.add_argument("model", help="a model name (as `geniex list` shows it)")
    c.add_argument("--soc", choices=sorted(npu_plan.SOCS), default=None,
                   help="the Snapdragon to compile for (default: this machine's; on x86_64, through Qualcomm's "
                        "simulator libraries, with GENIEX_QNN_SIMULATOR=1, the X Elite)")  # fmt: skip
    c.add_argument("--nctx", type=int, default=1024, help="the context the compiled shapes attend over (default 1024)")
    c.add_argument("--bundle", type=Path, metavar="OUT",
                   help="also write the model and its compiled graphs to the folder OUT, for `geniex pull NAME "
                        "--local OUT` on the laptop")  # fmt: skip
    c.add_argument("--shared-weights", action="store_true",
                   help="with --bundle, on x86_64: compile each part's prefill and decode contexts into one "
                        "binary holding the weights once, for the laptop's NPU memory (only a Snapdragon "
                        "loads them; this machine's cache gets the converted graphs alone)")  # fmt: skip
    add_data_dir(c)
    c.set_defaults(func=_compile)


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


def _compile(args: argparse.Namespace) -> int:
    if args.nctx < 1:
        raise SystemExit(f"error: --nctx must be 1 or more, not {args.nctx}")
    data_dir = args.data_dir if args.data_dir is not None else default_data_dir()
    try:
        entry = ModelStore(data_dir).resolve(args.model)
    except GenieXError as exc:
        raise SystemExit(f"error: {exc.message}") from None
    if not entry.path.endswith(".gguf"):
        raise SystemExit(f"error: {entry.id} is not a GGUF chat model (engine {entry.engine})")
    if args.bundle is not None and args.bundle.exists():
        raise SystemExit(f"error: {args.bundle} already exists")
    if args.shared_weights:
        _check_shared_weights(args.bundle)
    env = dict(os.environ)
    if args.soc:
        env["GENIEX_QNN_SOC_MODEL"] = str(npu_plan.SOCS[args.soc].soc_model)
    soc = npu_plan.SOCS[args.soc] if args.soc else npu_plan.detect_soc(env)[0]
    try:
        shape = npu_shape(entry.path)
    except (OSError, ValueError, struct.error, KeyError) as exc:  # a truncated or corrupt header
        raise SystemExit(f"error: {entry.id}: not a readable GGUF header ({exc})") from None
    plan = npu_plan.plan(shape, soc, args.nctx, shared_weights=args.shared_weights)
    if not plan.fits:
        print(f"error: {entry.id} does not fit the {soc.title}: {plan.why_not}", file=sys.stderr)
        return 1
    # The worker's own process: the converter and QNN are engine code, which the gateway never imports.
    command = [sys.executable, "-I", "-m", "workers.engines.npu.build", "--model-path", entry.path,
               "--cache-dir", str(data_dir / NPU_DIR), "--nctx", str(args.nctx), "--name", entry.id,
               *(["--bundle", str(args.bundle.absolute())] if args.bundle is not None else []),
               *(["--shared-weights"] if args.shared_weights else [])]  # fmt: skip
    return subprocess.run(command, env=env, check=False).returncode


def _check_shared_weights(bundle: Path | None) -> None:
    """Refuse `--shared-weights` where it cannot give a bundle whose binaries share their weights."""
    from protocol.npu_bundle import shared_generation_refused

    if bundle is None:
        raise SystemExit("error: --shared-weights needs --bundle OUT: only a Snapdragon loads weight-shared "
                         "contexts (Qualcomm's simulator here crashes loading them), so they are compiled for a "
                         "bundle to import there")  # fmt: skip
    if (why := shared_generation_refused()) is not None:
        raise SystemExit(f"error: {why}")


def import_bundle(store: ModelStore, folder: Path, name: str) -> ModelEntry:
    """A bundle's model into the store, and its compiled graphs into the NPU cache beside it. A bundle
    for another SoC, QNN or converter is refused whole (BadRequest naming why, nothing imported)."""
    from protocol.npu_bundle import BUNDLE_FILE, GRAPHS_DIR, BundleError, mismatch, qnn_version, read_bundle

    try:
        bundle = read_bundle(folder)
    except BundleError as exc:
        raise BadRequest(str(exc)) from None
    soc = npu_plan.detect_soc()[0].name
    why = mismatch(bundle, soc=soc, qnn_version=qnn_version(), converter_version=CONVERTER_VERSION)
    if why is not None:
        raise BadRequest(f"{folder}: its NPU graphs cannot be used here: {why}. Import the model alone with "
                         f"`geniex pull {name} --local {folder / bundle.gguf}`; its graphs are then built on "
                         "this machine at its first NPU load")  # fmt: skip
    entry = store.import_local(folder / bundle.gguf, name)
    cache = store.data_dir / NPU_DIR
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / cache_key(entry.path)
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=cache))
    try:
        for rel in bundle.files:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / GRAPHS_DIR / rel, tmp / rel)
        config = json.loads((tmp / CONFIG_FILE).read_text())
        config["source"] = str(Path(entry.path).resolve())  # the host reads the token embedding from it
        (tmp / CONFIG_FILE).write_text(json.dumps(config))
        # Kept with the graphs: the worker and the plan read from it whether the binaries share weights.
        shutil.copyfile(folder / BUNDLE_FILE, tmp / BUNDLE_FILE)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    except (OSError, ValueError) as exc:
        raise BadRequest(f"{folder}: its NPU graphs could not be imported: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry
