"""`geniex`: serve, pull, list, rm. Every serve flag also reads `GENIEX_<FLAG>`."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gateway.config import DEFAULT_HOST, Settings, default_data_dir, split_host


def _env(name: str, default: Any, cast: Callable[[str], Any] = str) -> Any:
    raw = os.environ.get(f"GENIEX_{name.upper().replace('-', '_')}")
    if raw is None or raw == "":
        return default
    try:
        return cast(raw)
    except ValueError:
        raise SystemExit(f"error: GENIEX_{name.upper().replace('-', '_')}={raw!r} is not a valid value") from None


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _add_serve(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("serve", help="run the OpenAI-compatible server")
    a = p.add_argument
    a("--host", default=_env("host", DEFAULT_HOST), help="HOST:PORT to bind (default 127.0.0.1:18181)")
    a("--nctx", type=int, default=_env("nctx", 4096, int), help="default context size per request")
    a("--ngl", type=int, default=_env("ngl", -1, int), help="default GPU layers (-1: all)")
    a("--compute", choices=["cpu", "gpu", "npu", "hybrid"], default=_env("compute", None))
    a("--keepalive", type=float, default=_env("keepalive", 300.0, float),
      help="stop a worker idle this many seconds (-1: never, 0: after each request)")  # fmt: skip
    a("--origins", type=_csv, default=_env("origins", [], _csv), help="comma-separated CORS origins")
    a("--data-dir", type=Path, default=default_data_dir())
    a("--log-level", default=_env("log_level", None), choices=["debug", "info", "warning", "error"])
    a("--parallel", type=int, default=_env("parallel", 0, int), help="sequences per worker (0: from nctx)")
    a("--max-queue", type=int, default=_env("max_queue", 16, int), help="queued requests per worker before 503")
    a("--max-loaded", type=int, default=_env("max_loaded", 0, int), help="resident workers (0: memory decides)")
    a("--memory-reserve", type=int, default=_env("memory_reserve", 1024, int), help="MiB of RAM to keep free")
    a("--drain-timeout", type=float, default=_env("drain_timeout", 30.0, float))
    a("--load-timeout", type=float, default=_env("load_timeout", 120.0, float))
    a("--preload", type=_csv, default=_env("preload", [], _csv), help="comma-separated models to load at start")
    a("--threads", type=int, default=_env("threads", 0, int), help="threads per worker (0: physical cores)")
    a("--crash-limit", type=int, default=_env("crash_limit", 3, int),
      help="crashes within --crash-window after which a model is refused for --crash-backoff (0: never)")  # fmt: skip
    a("--crash-window", type=float, default=_env("crash_window", 60.0, float))
    a("--crash-backoff", type=float, default=_env("crash_backoff", 30.0, float))
    a("--stream-interval", dest="stream_interval_ms", type=int, default=_env("stream_interval", 20, int),
      help="ms: tokens generated closer together than this are sent in one chunk, times the number of "
           "sequences decoding at once (0: one chunk per token)")  # fmt: skip
    a("--worker-nice", type=int, default=_env("worker_nice", 10, int),
      help="nice value of worker processes (0..19; 10 by default: decoding yields the CPU to the gateway, "
           "health probes and interactive programs; 0 where other CPU-heavy jobs must not outrank inference)")  # fmt: skip
    a("--grammar-dir", dest="grammar_dirs", action="append", type=Path,
      default=[Path(d) for d in _env("grammar_dir", "", str).split(os.pathsep) if d],
      help="a folder `grammar_path` may read GBNF files from (repeatable; none by default)")  # fmt: skip
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from protocol.startup import skip_rich

    skip_rich()
    import uvicorn

    from gateway.app import create_app
    from protocol.logs import configure_logging

    if not 0 <= args.worker_nice <= 19:
        raise SystemExit(f"error: --worker-nice must be 0..19, not {args.worker_nice}")
    host, port = split_host(args.host)
    settings = Settings(
        host=host,
        port=port,
        nctx=args.nctx,
        ngl=args.ngl,
        compute=args.compute,
        keepalive=args.keepalive,
        origins=args.origins,
        data_dir=args.data_dir,
        log_level=args.log_level,
        parallel=args.parallel,
        max_queue=args.max_queue,
        max_loaded=args.max_loaded,
        memory_reserve_mb=args.memory_reserve,
        drain_timeout=args.drain_timeout,
        load_timeout=args.load_timeout,
        preload=args.preload,
        threads=args.threads,
        crash_limit=args.crash_limit,
        crash_window=args.crash_window,
        crash_backoff=args.crash_backoff,
        grammar_dirs=args.grammar_dirs,
        stream_interval_ms=args.stream_interval_ms,
        worker_nice=args.worker_nice,
    )
    configure_logging(settings.log_level)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(settings.drain_timeout) or None,
        server_header=False,
    )
    _draining_server_class()(config, app).run()
    return 0


def _draining_server_class():  # type: ignore[no-untyped-def]
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """On SIGTERM/SIGINT, /ready turns 503 at once; uvicorn then stops accepting,
        lets in-flight requests finish (up to --drain-timeout), and the app's
        lifespan stops the workers."""

        def __init__(self, config: uvicorn.Config, app: Any) -> None:
            super().__init__(config)
            self._app = app

        def handle_exit(self, sig: int, frame: Any) -> None:
            self._app.state.draining = True
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn re-raises the signal after shutting down; a completed drain is a
            # clean stop, so exit 0 (systemd and supervisors read it that way too).
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return DrainingServer


def main(argv: list[str] | None = None) -> int:
    from gateway.models_cli import add_model_commands
    from gateway.usage_cli import add_usage_command

    parser = argparse.ArgumentParser(prog="geniex", description="GenieX Server: local OpenAI-compatible inference")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve(sub)
    add_model_commands(sub)
    add_usage_command(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
