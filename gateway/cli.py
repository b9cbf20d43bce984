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


class _Renamed(argparse._StoreAction):
    """A flag renamed (to carry its unit): its old spelling, the second option string, still works
    for a release, with a warning; so does its old GENIEX_* variable (`_env_defaults`)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:  # fmt: skip
        if option_string is not None and option_string != self.option_strings[0]:
            print(f"warning: {option_string} is deprecated; use {self.option_strings[0]}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def env_name(option: str) -> str:
    """`--max-queue` reads `GENIEX_MAX_QUEUE`."""
    return "GENIEX_" + option.lstrip("-").upper().replace("-", "_")


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="run the OpenAI-compatible server")
    a = p.add_argument
    a("--host", default=DEFAULT_HOST, help="address to bind (loopback by default)")
    a("--nctx", type=int, default=4096, help="context per request when the request has no `nctx`")
    a("--ngl", type=int, default=-1, help="GPU layers when the request has no `ngl` (-1 or 999: all)")
    a("--compute", type=str.lower, choices=["cpu", "gpu", "npu", "hybrid"], default=None,
      help=('`cpu`, `gpu`, `npu`, `hybrid` (any case; anything else, from the flag or `GENIEX_COMPUTE`, stops'
         ' the start); an unavailable unit falls back to CPU with a warning (by default the CPU)'))  # fmt: skip
    a(
        "--keep-alive-s",
        "--keepalive",
        type=float,
        default=300.0,
        help="seconds an idle worker stays loaded (-1: forever, 0: stop after each request)",
        action=_Renamed,
        dest="keepalive",
    )
    a(
        "--origins",
        type=_csv,
        default=[],
        help=(
            "comma-separated origins whose web pages may call the API (CORS, preflight included; every "
            "request header they ask for is allowed, `Retry-After` and `X-Request-Id` exposed); none by "
            "default, so no other site's page can read an answer"
        ),
    )
    a(
        "--data-dir",
        type=Path,
        default=None,
        help="model store and usage ledger (default `$GENIEX_DATADIR`, else `~/.cache/geniex`)",
    )
    a(
        "--log-level",
        default=None,
        choices=["debug", "info", "warning", "error"],
        help="`debug`, `info`, `warning`, `error` (default info)",
    )
    a(
        "--parallel",
        type=int,
        default=0,
        help=(
            "sequences one worker decodes at once (0: from nctx, 4 at nctx ≤ 4096, fewer for longer contexts); set 8 to "
            "serve eight clients at once"
        ),
    )
    a("--max-queue", type=int, default=16, help="requests waiting per worker before 503 + `Retry-After`")
    a(
        "--max-loaded",
        type=int,
        default=0,
        help=(
            "workers resident at once (0: as many as memory allows); the least recently used idle one is "
            "evicted first, a busy one never"
        ),
    )
    a(
        "--memory-reserve-mb",
        "--memory-reserve",
        type=int,
        default=1024,
        help="MiB of RAM to keep free when deciding whether another worker fits",
        action=_Renamed,
        dest="memory_reserve",
    )
    a(
        "--drain-timeout-s",
        "--drain-timeout",
        type=float,
        default=30.0,
        help=(
            "seconds SIGTERM waits for requests in flight; meanwhile `/ready` answers 503 and new work is "
            "refused with 503; those still running then end with 503 (an error event and `[DONE]` in a "
            "stream)"
        ),
        action=_Renamed,
        dest="drain_timeout",
    )
    a(
        "--load-timeout-s",
        "--load-timeout",
        type=float,
        default=120.0,
        help="seconds a worker may take to load its model",
        action=_Renamed,
        dest="load_timeout",
    )
    a("--preload", type=_csv, default=[], help="comma-separated models to load before `/ready` turns 200")
    a(
        "--threads",
        type=int,
        default=0,
        help=(
            "threads per worker (0: the physical cores); busy workers share the cores, and a worker uses "
            "fewer while other programs keep cores busy"
        ),
    )
    a("--crash-limit", type=int, default=3,
      help=('crashes within `--crash-window` after which a model is refused (503) for `--crash-backoff` '
         'seconds (0: never)'))  # fmt: skip
    a(
        "--crash-window-s",
        "--crash-window",
        type=float,
        default=60.0,
        help="seconds, see `--crash-limit`",
        action=_Renamed,
        dest="crash_window",
    )
    a(
        "--crash-backoff-s",
        "--crash-backoff",
        type=float,
        default=30.0,
        help="seconds, see `--crash-limit`",
        action=_Renamed,
        dest="crash_backoff",
    )
    a("--stream-interval-ms", "--stream-interval", dest="stream_interval_ms", type=int, default=20,
      help=('ms: tokens generated closer together than this go out in one chunk (the first token always at '
         "once; 0: a chunk per token). With N sequences decoding at once a stream's interval is N × this, "
         'so the chunks a worker sends per second stay about level under load (4 streams: client + gateway'
         ' CPU per token 0.95 → 0.42 ms)'), action=_Renamed)  # fmt: skip
    a("--worker-nice", type=int, default=0,
      help=("added to the workers' nice value. At 0 they run at the gateway's priority. A higher value buys a"
         ' little `/health` latency on an idle box (p99 with 4 streams: 6.8 ms at 0, 3.5 ms at 10) and '
         "gives every other busy program about ten times the worker's CPU share: with one busy process "
         'beside it, 50 tokens took 151 s at nice 10 before the thread governor below'))  # fmt: skip
    a("--cache-ram-mb", "--cache-ram", dest="cache_ram_mb", type=int, default=1024,
      help=('MiB of host RAM per chat worker for saved prompt states (0: only what the slots hold); counted '
         'in the memory a worker needs'), action=_Renamed)  # fmt: skip
    a("--api-key", dest="api_keys", action="append", default=[],
      help=('a key every API request must send (`Authorization: Bearer KEY` or `x-api-key: KEY`; repeatable);'
         ' without any key the server answers everyone who can connect'))  # fmt: skip
    a("--api-key-file", type=Path, default=None,
      help=('keys, one per line, an optional label and optional limits after each (`KEY LABEL rpm=60 '
         'tpm=20000 concurrent=2`, `#` comments); read again on SIGHUP. The ledger, the logs and the '
         'prompt cache know a caller by the label (or a hash of the key), never by the key. Over a limit: '
         '429 with `Retry-After`, naming the limit; `rpm`/`tpm` are sliding minutes (tokens are prompt '
         'plus completion, counted as a request ends), `concurrent` counts requests in flight; per-key '
         'series in `/metrics` (`geniex:key_*`)'))  # fmt: skip
    a(
        "--metrics-key",
        action="store_true",
        default=False,
        help="`/metrics` needs a key too (`/health` and `/ready` never do)",
    )
    a("--insecure-no-auth", action="store_true", default=False,
      help='bind an address other machines can reach without any API key (refused otherwise; logged loudly)')  # fmt: skip
    a(
        "--certfile",
        type=Path,
        default=None,
        help=(
            "serve HTTPS with this PEM certificate (chain); needs `--keyfile`. A pair that does not load "
            "stops the start with one line"
        ),
    )
    a("--keyfile", type=Path, default=None, help="the certificate's PEM private key")
    a("--max-connections", type=int, default=512,
      help=('requests served at once (health probes aside); beyond it a request gets a JSON 503 with '
         '`Retry-After` at once rather than queueing without bound, and connections beyond twice this are '
         'refused'))  # fmt: skip
    a("--max-body-mb", "--max-body", dest="max_body_mb", type=int, default=32,
      help=('MiB a request body may hold (images and audio travel inside it); a larger one is a 413, refused '
         'without reading the rest'), action=_Renamed)  # fmt: skip
    a("--max-nctx", type=int, default=0,
      help=('the largest `nctx` a request may ask for; 0: the context each model was trained for (its GGUF '
         'says), so `nctx` beyond it is a 400'))  # fmt: skip
    a("--allowed-host", dest="allowed_hosts", action="append", default=[],
      help=('a `Host` name the server answers to besides loopback names and the address it binds (repeatable,'
         ' `GENIEX_ALLOWED_HOST` takes a `:`-separated list; `*` for any); any other gets 403, a defence '
         'against DNS rebinding'))  # fmt: skip
    a("--fetch-host", dest="fetch_hosts", action="append", default=[],
      help=('a host whose http(s) URLs requests may name for images and audio (`/v1/cv`, `/v1/audio/diarize`;'
         " repeatable). Off by default: fetching on a client's behalf is a server-side request forgery "
         'risk. Redirects are not followed; the size is bounded by `--max-body` and the time by 10 s'))  # fmt: skip
    a("--media-dir", dest="media_dirs", action="append", type=Path, default=[],
      help=('a folder whose images chat requests may name by local path or `file://` URL (repeatable; '
         '`GENIEX_MEDIA_DIR` takes a `:`-separated list); symlinks are resolved before the check'))  # fmt: skip
    a("--grammar-dir", dest="grammar_dirs", action="append", type=Path, default=[],
      help=('a folder `grammar_path` may read GBNF files from (repeatable; `GENIEX_GRAMMAR_DIR` takes a '
         '`:`-separated list)'))  # fmt: skip
    a("--no-webui", dest="webui", action="store_false", default=True,
      help='serve no web UI (`/`, `/ops`, `/try`, `/docs`) and no `/openapi.json` (`GENIEX_NO_WEBUI=1`)')  # fmt: skip
    a("--qnn-simulator", action="store_true", default=False,
      help=("on x86_64, let `compute: npu` use Qualcomm's HTP simulator (slow: development and tests only; "
         'see docs/accelerators.md). Without it, where there is no NPU, `npu` falls back to'
         ' the CPU with a warning'))  # fmt: skip
    p.set_defaults(func=_serve)
    return p


def serve_parser() -> argparse.ArgumentParser:
    """The `serve` flags alone (docs/operating.md's settings table is made from them)."""
    return _add_serve(argparse.ArgumentParser(prog="geniex").add_subparsers())


def serve_flags(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and a.dest != "help"]


def _env_defaults(p: argparse.ArgumentParser) -> None:
    """Every flag's default from its GENIEX_<FLAG> variable; a list flag takes a separated list
    (`,` for --origins/--preload, the path separator for --grammar-dir)."""
    for action in serve_flags(p):
        name = env_name(action.option_strings[0])
        raw = os.environ.get(name)
        if (raw is None or raw == "") and isinstance(action, _Renamed):
            name = env_name(action.option_strings[1])  # the flag's old spelling
            raw = os.environ.get(name)
            if raw:
                print(f"warning: {name} is deprecated; use {env_name(action.option_strings[0])}", file=sys.stderr)
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
    known = {env_name(o) for a in serve_flags(p) for o in a.option_strings} | set(OTHER_ENV)
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
