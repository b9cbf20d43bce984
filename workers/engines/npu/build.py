"""`python -m workers.engines.npu.build --model-path GGUF --cache-dir DIR [--nctx N] [--bundle OUT --name NAME
[--shared-weights]]`: convert a chat GGUF for the NPU and compile its QNN context binaries into the cache,
as the first NPU load would, and optionally write them out as a bundle for another machine
(protocol/npu_bundle.py). With `--shared-weights` (x86_64) the bundle's binaries are weight-shared ones
(shared.py), compiled for the bundle alone: the cache gets the converted graphs, and no contexts, since
this machine's simulator cannot load them. `geniex npu compile` runs it in a process of its own (the
gateway imports no engine)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import structlog

from protocol import npu_plan
from protocol.logs import configure_logging
from protocol.npu_bundle import BUNDLE_FILE, GRAPHS_DIR, Bundle, qnn_version, shared_generation_refused
from protocol.npu_cache import CONVERTER_VERSION
from protocol.worker_args import WorkerArgs

log = structlog.get_logger("worker.npu.build")


def write_bundle(folder: Path, gguf: Path, out: Path, name: str, soc: str, nctx: int,
                 shared: Path | None = None) -> Bundle:  # fmt: skip
    """The converted `folder` and its GGUF as a bundle in `out` (which must not exist), written under a
    temporary name and renamed when complete. `shared`: a folder of weight-shared contexts, shipped
    beside the graphs instead of any unshared ones this machine compiled."""
    from workers.engines.npu.decoder import CONTEXT_PREFIX

    if out.exists():
        raise FileExistsError(f"{out} already exists")
    sources = {str(f.relative_to(folder)): f for f in folder.rglob("*") if f.is_file()}
    if shared is not None:
        sources = {rel: f for rel, f in sources.items() if not f.name.startswith(CONTEXT_PREFIX)}
        sources.update({f.name: f for f in shared.iterdir() if f.is_file()})
    tmp = Path(tempfile.mkdtemp(prefix=".bundle-", dir=out.parent))
    try:
        files = sorted(sources)
        for rel in files:
            (tmp / GRAPHS_DIR / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(sources[rel], tmp / GRAPHS_DIR / rel)
        shutil.copyfile(gguf, tmp / gguf.name)
        bundle = Bundle(model=name, gguf=gguf.name, soc=soc, qnn_version=qnn_version(),
                        converter_version=CONVERTER_VERSION, nctx=nctx, files=files,
                        shared_weights=shared is not None)  # fmt: skip
        (tmp / BUNDLE_FILE).write_bytes(msgspec.json.format(msgspec.json.encode(bundle)))
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return bundle


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workers.engines.npu.build")
    p.add_argument("--model-path", required=True)
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--nctx", type=int, default=1024)
    p.add_argument("--bundle", type=Path, help="also write the model and its compiled graphs here")
    p.add_argument("--name", default="", help="the model's name, for the bundle's manifest")
    p.add_argument("--shared-weights", action="store_true",
                   help="the bundle's prefill and decode contexts share one copy of the weights (x86_64 only)")  # fmt: skip
    args = p.parse_args(argv)
    configure_logging("info", worker="npu-build")
    if args.shared_weights and args.bundle is None:
        p.error("--shared-weights compiles for a bundle: give --bundle OUT")
    opts = WorkerArgs(engine="llama_npu", model_path=args.model_path, compute="npu", nctx=args.nctx,
                      cache_dir=args.cache_dir)  # fmt: skip
    soc = npu_plan.detect_soc()[0].name
    staging = Path(tempfile.mkdtemp(prefix=".shared-", dir=args.bundle.parent)) if args.shared_weights else None
    try:
        built = compile_shared(opts, staging, soc) if staging is not None else compile_here(opts, soc)
        if built is None:
            return 1
        if args.bundle is not None:
            try:
                bundle = write_bundle(built[0], Path(args.model_path), args.bundle, args.name, soc, built[1], staging)
            except OSError as exc:
                print(f"error: cannot write the bundle {args.bundle}: {exc}", file=sys.stderr)
                return 1
            shared = ", weight-shared" if bundle.shared_weights else ""
            print(f"bundle {args.bundle}: {len(bundle.files)} files for the {soc}{shared}, "
                  f"onnxruntime-qnn {bundle.qnn_version}")  # fmt: skip
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return 0


def compile_here(opts: WorkerArgs, soc: str) -> tuple[Path, int] | None:
    """Each shape's context binary compiled into the cache, as the first NPU load would: the converted
    folder and its context; None (the reason printed) when it cannot be."""
    from workers.engines.npu.engine import NpuChatEngine, NpuUnavailable

    try:
        engine = NpuChatEngine(opts)
    except NpuUnavailable as exc:
        print(f"error: {opts.model_path} cannot be compiled for the NPU here: {exc}", file=sys.stderr)
        return None
    folder, nctx = engine.folder, engine.n_ctx
    builds = list(engine.builds)
    engine.close()
    print(f"compiled {len(builds)} QNN contexts for the {soc} in {sum(s for _, s, _ in builds):.1f} s: {folder}")
    return folder, nctx


def compile_shared(opts: WorkerArgs, out: Path, soc: str) -> tuple[Path, int] | None:
    """The weight-shared contexts, into `out` (workers/engines/npu/shared.py), the model planned with
    its weights once: the converted folder and its context; None (the reason printed) when they cannot be."""
    from workers.engines.npu.engine import NpuUnavailable, prepare
    from workers.engines.npu.shared import SharedWeightsError
    from workers.engines.npu.shared import compile_shared as compile_parts
    from workers.engines.onnx import npu_devices, qnn_options

    if (why := shared_generation_refused()) is not None:
        print(f"error: {why}", file=sys.stderr)
        return None
    devices, why = npu_devices()
    try:
        if why is not None:
            raise NpuUnavailable(why)
        converted = prepare(opts, plan=True, shared_weights=True)
    except NpuUnavailable as exc:
        print(f"error: {opts.model_path} cannot be compiled for the NPU here: {exc}", file=sys.stderr)
        return None
    t0 = time.perf_counter()
    try:
        parts = compile_parts(converted.folder, converted.cfg, converted.n_ctx, devices, qnn_options(), out)
    except SharedWeightsError as exc:
        print(f"error: onnxruntime-qnn {qnn_version()} cannot compile weight-shared contexts: {exc}", file=sys.stderr)
        return None
    print(f"compiled {sum(len(p.contexts) for p in parts)} weight-shared QNN contexts into {len(parts)} "
          f"binaries for the {soc} in {time.perf_counter() - t0:.1f} s: {converted.folder}")  # fmt: skip
    return converted.folder, converted.n_ctx


if __name__ == "__main__":
    sys.exit(main())
