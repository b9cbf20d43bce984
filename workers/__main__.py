"""`python -m workers --engine llama_cpp --model-path PATH ...`: one worker process, its arguments
those of protocol/worker_args.py."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from protocol.startup import skip_rich

skip_rich()  # before structlog is imported, below
# onnxruntime (the ONNX, OCR, speech and diarization engines) otherwise looks up Microsoft's
# telemetry host from Linux during session.run (seen with strace): a local server sends nothing out.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

from protocol import worker_args  # noqa: E402
from protocol.logs import configure_logging  # noqa: E402

PR_SET_PDEATHSIG = 1
# Added to the worker's oom_score_adj (Linux: -1000..1000). When memory runs out, the kernel (or
# the cgroup's limit, systemd's MemoryMax=) kills a worker, which costs one model, before the
# gateway, which would cost the whole service.
OOM_SCORE_ADJ_RAISE = 500


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to kill us when the gateway dies, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except OSError:
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _lower_priority(nice: int) -> None:
    """Before any thread exists: Linux nice values are per thread, and the ZeroMQ and
    llama.cpp threads started later inherit this one's."""
    if nice > 0 and hasattr(os, "nice"):
        try:
            os.nice(nice)
        except OSError:
            pass


def _offer_to_oom_killer(raise_by: int = OOM_SCORE_ADJ_RAISE, path: str = "/proc/self/oom_score_adj") -> None:
    """Raise our own oom_score_adj (raising needs no privilege; lowering would). Relative to the
    gateway's, which we inherit, so an operator's OOMScoreAdjust= still orders the service among
    other programs. Nothing to do where there is no /proc."""
    try:
        with open(path) as f:
            current = int(f.read())
        with open(path, "w") as f:
            f.write(str(min(1000, current + raise_by)))
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    try:
        args = worker_args.parse(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(f"python -m workers: {exc}", file=sys.stderr)
        return 2
    _die_with_parent(args.parent_pid)
    _lower_priority(args.nice)
    _offer_to_oom_killer()
    # SIGINT goes to the whole process group on Ctrl-C; the gateway decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(args.log_level, worker=args.name)

    # A worker never reaches a model hub (the gateway pulls models): set before any engine imports
    # huggingface_hub (faster-whisper, diffusers), which reads it once. Here, not at import, so that
    # a test process importing this module keeps its own environment.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from workers.engines import load_engine
    from workers.server import run

    return run(lambda: load_engine(args.engine, args), args.inbox, args.outbox, args.parent_pid)


if __name__ == "__main__":
    sys.exit(main())
