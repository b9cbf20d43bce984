"""`python -m workers.engines.npu.build --model-path GGUF --cache-dir DIR [--nctx N] [--bundle OUT --name NAME]`:
convert a chat GGUF for the NPU and compile its QNN context binaries into the cache, as the first NPU
load would, and optionally write them out as a bundle for another machine (protocol/npu_bundle.py).
`geniex npu compile` runs it in a process of its own (the gateway imports no engine)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import msgspec
import structlog

from protocol import npu_plan
from protocol.logs import configure_logging
from protocol.npu_bundle import BUNDLE_FILE, GRAPHS_DIR, Bundle, qnn_version
from protocol.npu_cache import CONVERTER_VERSION
from protocol.worker_args import WorkerArgs

log = structlog.get_logger("worker.npu.build")


def write_bundle(folder: Path, gguf: Path, out: Path, name: str, soc: str, nctx: int) -> Bundle:
    """The converted `folder` and its GGUF as a bundle in `out` (which must not exist), written under a
    temporary name and renamed when complete."""
    if out.exists():
        raise FileExistsError(f"{out} already exists")
    tmp = Path(tempfile.mkdtemp(prefix=".bundle-", dir=out.parent))
    try:
        files = sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())
        for rel in files:
            (tmp / GRAPHS_DIR / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / rel, tmp / GRAPHS_DIR / rel)
        shutil.copyfile(gguf, tmp / gguf.name)
        bundle = Bundle(model=name, gguf=gguf.name, soc=soc, qnn_version=qnn_version(),
                        converter_version=CONVERTER_VERSION, nctx=nctx, files=files)  # fmt: skip
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
    args = p.parse_args(argv)
    configure_logging("info", worker="npu-build")

    from workers.engines.npu.engine import NpuChatEngine, NpuUnavailable

    opts = WorkerArgs(engine="llama_npu", model_path=args.model_path, compute="npu", nctx=args.nctx,
                      cache_dir=args.cache_dir)  # fmt: skip
    try:
        engine = NpuChatEngine(opts)
    except NpuUnavailable as exc:
        print(f"error: {args.model_path} cannot be compiled for the NPU here: {exc}", file=sys.stderr)
        return 1
    folder, nctx = engine.folder, engine.n_ctx
    builds = list(engine.builds)
    engine.close()
    soc = npu_plan.detect_soc()[0].name
    print(f"compiled {len(builds)} QNN contexts for the {soc} in {sum(s for _, s, _ in builds):.1f} s: {folder}")
    if args.bundle is not None:
        try:
            bundle = write_bundle(folder, Path(args.model_path), args.bundle, args.name, soc, nctx)
        except OSError as exc:
            print(f"error: cannot write the bundle {args.bundle}: {exc}", file=sys.stderr)
            return 1
        print(f"bundle {args.bundle}: {len(bundle.files)} files for the {soc}, onnxruntime-qnn {bundle.qnn_version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
