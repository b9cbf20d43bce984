"""`geniex`: serve, pull, list, rm. Every serve flag also reads `GENIEX_<FLAG>`."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import ipaddress
import os
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gateway.ops.settings import DEFAULT_HOST, Settings, default_data_dir, split_host
from protocol import qnn

# GENIEX_* variables that no flag reads but that the server does: the data dir's historical
# spelling, llama.cpp's error log switch, and the QNN simulator's SoC model.
OTHER_ENV = ("GENIEX_DATADIR", "GENIEX_LLAMA_LOG", "GENIEX_QNN_SOC_MODEL")


def env_name(option: str) -> str:
    """`--max-queue` reads `GENIEX_MAX_QUEUE`."""
    return "GENIEX_" + option.lstrip("-").upper().replace("-", "_")


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="run the OpenAI-compatible server")
    a = p.add_argument
    a("--host", default=DEFAULT_HOST, help="HOST:PORT to bind (default 127.0.0.1:18181)")
    a("--nctx", type=int, default=4096, help="default context size per request")
    a("--ngl", type=int, default=-1, help="default GPU layers (-1: all)")
    a("--compute", type=str.lower, choices=["cpu", "gpu", "npu", "hybrid"], default=None,
      help="default compute unit (any case)")  # fmt: skip
    a(
        "--keepalive",
        type=float,
        default=300.0,
        help="stop a worker idle this many seconds (-1: never, 0: after each request)",
    )
    a("--origins", type=_csv, default=[], help="comma-separated CORS origins")
    a(
        "--data-dir",
        type=Path,
        default=None,
        help="model store and usage ledger (default $GENIEX_DATADIR or ~/.cache/geniex)",
    )
    a("--log-level", default=None, choices=["debug", "info", "warning", "error"])
    a("--parallel", type=int, default=0, help="sequences per worker (0: from nctx)")
    a("--max-queue", type=int, default=16, help="queued requests per worker before 503")
    a("--max-loaded", type=int, default=0, help="resident workers (0: memory decides)")
    a("--memory-reserve", type=int, default=1024, help="MiB of RAM to keep free")
    a("--drain-timeout", type=float, default=30.0, help="seconds in-flight requests may take to finish on SIGTERM")
    a("--load-timeout", type=float, default=120.0, help="seconds a worker may take to load its model")
    a("--preload", type=_csv, default=[], help="comma-separated models to load at start")
    a("--threads", type=int, default=0, help="threads per worker (0: physical cores)")
    a("--crash-limit", type=int, default=3,
      help="crashes within --crash-window after which a model is refused for --crash-backoff (0: never)")  # fmt: skip
    a("--crash-window", type=float, default=60.0)
    a("--crash-backoff", type=float, default=30.0)
    a("--stream-interval", dest="stream_interval_ms", type=int, default=20,
      help="ms: tokens generated closer together than this are sent in one chunk, times the number of "
           "sequences decoding at once (0: one chunk per token)")  # fmt: skip
    a("--worker-nice", type=int, default=0,
      help="added to the workers' nice value (0..19; 0 by default: workers run at the gateway's priority. "
           "Above 0, any other busy program outranks inference; see the README)")  # fmt: skip
    a("--cache-ram", dest="cache_ram_mb", type=int, default=1024,
      help="MiB of host RAM per chat worker for saved prompt states (0: keep only what is in the slots)")  # fmt: skip
    a("--api-key", dest="api_keys", action="append", default=[],
      help="a key every API request must send (Authorization: Bearer KEY or x-api-key: KEY); repeatable")  # fmt: skip
    a("--api-key-file", type=Path, default=None,
      help="keys, one per line with an optional label after each; read again on SIGHUP")  # fmt: skip
    a("--metrics-key", action="store_true", default=False, help="/metrics needs a key too (open by default)")
    a("--insecure-no-auth", action="store_true", default=False,
      help="allow binding beyond loopback without any API key (refused otherwise)")  # fmt: skip
    a("--certfile", type=Path, default=None, help="serve HTTPS with this PEM certificate (chain); needs --keyfile")
    a("--keyfile", type=Path, default=None, help="the certificate's PEM private key")
    a("--max-connections", type=int, default=512,
      help="requests served at once (health probes aside); beyond it a request gets 503 with Retry-After "
           "at once, and connections beyond twice this are refused")  # fmt: skip
    a("--max-body", dest="max_body_mb", type=int, default=32,
      help="MiB a request body may hold (images and audio travel inside it); larger is a 413")  # fmt: skip
    a("--max-nctx", type=int, default=0,
      help="the largest `nctx` a request may ask for (0: the context each model was trained for)")  # fmt: skip
    a("--allowed-host", dest="allowed_hosts", action="append", default=[],
      help="a Host name this server answers to besides loopback and the address it binds (repeatable; "
           "'*' for any); others get 403, against DNS rebinding")  # fmt: skip
    a("--fetch-host", dest="fetch_hosts", action="append", default=[],
      help="a host whose http(s) URLs requests may name for images and audio (repeatable; none by "
           "default: fetching for a client is a server-side request forgery risk)")  # fmt: skip
    a("--media-dir", dest="media_dirs", action="append", type=Path, default=[],
      help="a folder whose images chat requests may name by local path or file:// URL (repeatable; "
           "none by default)")  # fmt: skip
    a("--grammar-dir", dest="grammar_dirs", action="append", type=Path, default=[],
      help="a folder `grammar_path` may read GBNF files from (repeatable; none by default)")  # fmt: skip
    a("--no-webui", dest="webui", action="store_false", default=True,
      help="serve no web UI (/, /ops, /try, /docs) and no /openapi.json")  # fmt: skip
    a("--qnn-simulator", action="store_true", default=False,
      help="on x86_64, let `compute: npu` use Qualcomm's HTP simulator (slow: for development and tests; "
           "without it npu falls back to the CPU where there is no NPU)")  # fmt: skip
    p.set_defaults(func=_serve)
    return p


def serve_parser() -> argparse.ArgumentParser:
    """The `serve` flags alone (the README's table is checked against them)."""
    return _add_serve(argparse.ArgumentParser(prog="geniex").add_subparsers())


def serve_flags(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and a.dest != "help"]


def _env_defaults(p: argparse.ArgumentParser) -> None:
    """Every flag's default from its GENIEX_<FLAG> variable; a list flag takes a separated list
    (`,` for --origins/--preload, the path separator for --grammar-dir)."""
    for action in serve_flags(p):
        name = env_name(action.option_strings[0])
        raw = os.environ.get(name)
        if raw is None or raw == "":
            continue
        cast: Callable[[str], Any] = action.type or str  # type: ignore[assignment]
        value: Any
        try:
            if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
                # A switch: GENIEX_NO_WEBUI=1 sets it, =0 leaves it off (a string default would be truthy).
                value = action.const if raw.strip().lower() in ("1", "true", "yes", "on") else not action.const
            elif isinstance(action, argparse._AppendAction):
                value = [cast(v) for v in raw.split(os.pathsep) if v]
            else:
                value = cast(raw)
        except (ValueError, argparse.ArgumentTypeError):
            raise SystemExit(f"error: {name}={raw!r} is not a valid value for {action.option_strings[0]}") from None
        if action.choices is not None and value not in action.choices:
            raise SystemExit(f"error: {name}={raw!r}: choose from {', '.join(map(str, action.choices))}")
        action.default = value


def unknown_env(p: argparse.ArgumentParser, environ: Mapping[str, str]) -> list[str]:
    """Warnings for GENIEX_* variables that nothing reads (a typo would otherwise be silent)."""
    known = {env_name(a.option_strings[0]) for a in serve_flags(p)} | set(OTHER_ENV)
    out = []
    for name in sorted(k for k in environ if k.startswith("GENIEX_") and k not in known):
        close = difflib.get_close_matches(name[7:], sorted(k[7:] for k in known), n=1)  # past "GENIEX_"
        out.append(f"{name} is set, but no setting reads it" + (f" (did you mean GENIEX_{close[0]}?)" if close else ""))
    return out


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is this machine's loopback."""
    try:
        infos = socket.getaddrinfo(host or "0.0.0.0", None)
    except OSError:
        return False
    return all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def check_tls(certfile: Path | None, keyfile: Path | None) -> None:
    """Both or neither, and a pair that loads: a bad certificate is one clear line at start, not a
    traceback from inside the HTTP server."""
    if (certfile is None) != (keyfile is None):
        raise SystemExit("error: HTTPS needs both --certfile and --keyfile")
    if certfile is None or keyfile is None:
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise SystemExit(f"error: --certfile {certfile} / --keyfile {keyfile}: {exc}") from None


def _listen(host: str, port: int) -> socket.socket:
    """Bind before anything announces that the server is up; a busy port is one clear line."""
    try:
        family, kind, proto, _name, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as exc:
        why = "the address is already in use (is another server running there?)" if exc.errno == errno.EADDRINUSE \
            else (exc.strerror or str(exc))  # fmt: skip
        raise SystemExit(f"error: cannot listen on {host}:{port}: {why}") from None
    return sock


def _serve(args: argparse.Namespace) -> int:
    from protocol.startup import skip_rich

    skip_rich()
    import structlog
    import uvicorn

    from gateway.api.app import create_app
    from gateway.api.lifecycle import Lifecycle
    from gateway.ops.keys import KeyFileError, KeyRing
    from protocol.logs import configure_logging

    if not 0 <= args.worker_nice <= 19:
        raise SystemExit(f"error: --worker-nice must be 0..19, not {args.worker_nice}")
    if args.cache_ram_mb < 0:
        raise SystemExit(f"error: --cache-ram must be 0 or more MiB, not {args.cache_ram_mb}")
    if args.max_connections < 1:
        raise SystemExit(f"error: --max-connections must be 1 or more, not {args.max_connections}")
    if args.max_body_mb < 1:
        raise SystemExit(f"error: --max-body must be 1 or more MiB, not {args.max_body_mb}")
    if args.max_nctx < 0:
        raise SystemExit(f"error: --max-nctx must be 0 (each model's trained context) or more, not {args.max_nctx}")
    check_tls(args.certfile, args.keyfile)
    if args.qnn_simulator and str(args.qnn_simulator).lower() not in ("0", "false", "no", "off"):
        os.environ[qnn.SIMULATOR_ENV] = "1"  # read by the gateway's compute choice and by the workers
    host, port = split_host(args.host)
    keyed = bool(args.api_keys or args.api_key_file)
    if not keyed and not args.insecure_no_auth and not is_loopback(host):
        raise SystemExit(f"error: {host} is reachable beyond this machine and no API key is set; give --api-key or "
                         "--api-key-file (or --insecure-no-auth to serve anyone who can connect)")  # fmt: skip
    sock = _listen(host, port)
    settings = Settings(
        host=host,
        port=port,
        nctx=args.nctx,
        ngl=args.ngl,
        compute=args.compute,
        keepalive=args.keepalive,
        origins=args.origins,
        data_dir=args.data_dir or default_data_dir(),
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
        media_dirs=args.media_dirs,
        fetch_hosts=args.fetch_hosts,
        stream_interval_ms=args.stream_interval_ms,
        worker_nice=args.worker_nice,
        cache_ram_mb=args.cache_ram_mb,
        allowed_hosts=args.allowed_hosts,
        api_keys=args.api_keys,
        api_key_file=args.api_key_file,
        metrics_key=args.metrics_key,
        insecure_no_auth=args.insecure_no_auth,
        certfile=args.certfile,
        keyfile=args.keyfile,
        max_connections=args.max_connections,
        max_body_mb=args.max_body_mb,
        max_nctx=args.max_nctx,
        webui=args.webui,
    )
    configure_logging(settings.log_level)
    log = structlog.get_logger("gateway")
    for warning in args.env_warnings:
        log.warning(warning)
    if not keyed and not is_loopback(host):
        log.warning("serving WITHOUT API KEYS on an address other machines can reach", host=host)
    lifecycle = Lifecycle()
    try:
        keys = KeyRing(settings.api_keys, settings.api_key_file)
    except (OSError, KeyFileError) as exc:
        raise SystemExit(f"error: --api-key-file {settings.api_key_file}: {exc}") from None
    app = create_app(settings, lifecycle, keys)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        # In-flight requests have finished (or run out of time) before uvicorn is told to stop.
        timeout_graceful_shutdown=2,
        server_header=False,
        # Requests beyond --max-connections get a JSON 503 from DrainMiddleware; uvicorn's own
        # refusal (plain text) is only the backstop against a flood of idle kept-alive connections.
        limit_concurrency=2 * settings.max_connections,
        ssl_certfile=settings.certfile,
        ssl_keyfile=settings.keyfile,
    )
    _draining_server_class()(config, lifecycle, settings.drain_timeout).run(sockets=[sock])
    return 0


def _draining_server_class():  # type: ignore[no-untyped-def]
    import asyncio

    import uvicorn

    class DrainingServer(uvicorn.Server):
        """On SIGTERM/SIGINT the server keeps listening while requests are in flight (up to
        --drain-timeout): /ready answers 503 and new work is refused (gateway/api/lifecycle.py), so a
        load balancer sees the drain. Then uvicorn stops accepting and the app's lifespan stops
        the workers. A second signal stops at once."""

        def __init__(self, config: uvicorn.Config, lifecycle: Any, drain_timeout: float) -> None:
            super().__init__(config)
            self._drain = lifecycle
            self._drain_timeout = drain_timeout
            self._draining: asyncio.Task[None] | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self._drain.draining or self._drain_timeout <= 0:
                return super().handle_exit(sig, frame)
            self._drain.draining = True
            # A signal handler runs between any two bytecodes: hand over to the loop first.
            asyncio.get_event_loop().call_soon_threadsafe(self._start_drain, sig)

        def _start_drain(self, sig: int) -> None:
            self._draining = asyncio.ensure_future(self._finish_drain(sig))

        async def _finish_drain(self, sig: int) -> None:
            await self._drain.finish(self._drain_timeout)
            super().handle_exit(sig, None)

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
    from gateway.models.cli import add_model_commands
    from gateway.ops.usage_cli import add_usage_command

    parser = argparse.ArgumentParser(prog="geniex", description="GenieX Server: local OpenAI-compatible inference")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = _add_serve(sub)
    _env_defaults(serve)
    serve.set_defaults(env_warnings=unknown_env(serve, os.environ))
    add_model_commands(sub)
    add_usage_command(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
