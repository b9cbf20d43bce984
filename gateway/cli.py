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

from gateway.ops.settings import Settings, declared, out_of_bounds, split_host
from protocol import qnn

# GENIEX_* variables that no flag reads but that the server does: the data dir's historical
# spelling, llama.cpp's error log switch, and the QNN simulator's SoC model.
OTHER_ENV = ("GENIEX_DATADIR", "GENIEX_LLAMA_LOG", "GENIEX_QNN_SOC_MODEL")
IDLE_CONNECTION_S = 75  # seconds an idle HTTP connection is kept (nginx's default): see _serve


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


def _csv(cast: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def read(value: str) -> list[Any]:
        return [cast(v.strip()) for v in value.split(",") if v.strip()]

    return read


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """`geniex serve`, a flag per declared setting (gateway/ops/settings.py)."""
    p = sub.add_parser("serve", help="run the OpenAI-compatible server")
    for s in declared():
        kw: dict[str, Any] = {"dest": s.name, "help": s.flag.help, "default": s.default}
        cast: Callable[[str], Any] = str.lower if s.flag.lower else s.kind
        if s.kind is bool:
            kw["action"] = "store_false" if s.default else "store_true"
        elif s.is_list and not s.flag.csv:
            kw.update(action="append", type=cast)
        else:
            kw["type"] = _csv(cast) if s.is_list else cast
            if s.flag.old:
                kw["action"] = _Renamed
        if s.kind is not bool and not s.flag.choices:
            kw["metavar"] = s.option[2:].upper().replace("-", "_")
        if s.flag.choices:
            kw["choices"] = s.flag.choices
        p.add_argument(s.option, *([s.flag.old] if s.flag.old else []), **kw)
    p.set_defaults(func=_serve)
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    """The Settings a parsed `geniex serve` command line (and its GENIEX_* defaults) declares."""
    values = {s.name: getattr(args, s.name) for s in declared() if getattr(args, s.name) is not None}
    values["host"], values["port"] = split_host(args.host)
    return Settings(**values)


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

    from gateway.app import create_app
    from gateway.dialects.ollama.root import OllamaRoot
    from gateway.http.lifecycle import Lifecycle
    from gateway.mcp.config import McpConfigError
    from gateway.models.models_file import ModelsFile, ModelsFileError
    from gateway.models.store import ModelStore
    from gateway.ops.keys import KeyFileError, KeyRing
    from protocol.logs import configure_logging

    settings = settings_from(args)
    for problem in out_of_bounds(settings):
        raise SystemExit(f"error: {problem}")
    check_tls(settings.certfile, settings.keyfile)
    if settings.qnn_simulator:
        os.environ[qnn.SIMULATOR_ENV] = "1"  # read by the gateway's compute choice and by the workers
    host, port = settings.host, settings.port
    keyed = bool(settings.api_keys or settings.api_key_file)
    if not keyed and not settings.insecure_no_auth and not is_loopback(host):
        raise SystemExit(f"error: {host} is reachable beyond this machine and no API key is set; give --api-key or "
                         "--api-key-file (or --insecure-no-auth to serve anyone who can connect)")  # fmt: skip
    socks = [_listen(host, port)]
    if settings.ollama_port and settings.ollama_port != port:
        socks.append(_listen(host, settings.ollama_port))  # `--ollama-port`: the same app on Ollama's port too
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
    try:
        models_file = ModelsFile(settings.models_file, ModelStore(settings.data_dir))
    except ModelsFileError as exc:
        raise SystemExit(f"error: --models-file: {exc}") from None
    # Ollama's clients probe the root with HEAD /: answered before Litestar routes (where `/` is the web page).
    try:
        app = OllamaRoot(create_app(settings, lifecycle, keys, models_file))
    except McpConfigError as exc:
        raise SystemExit(f"error: --mcp-config {settings.mcp_config}: {exc}") from None
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        # In-flight requests have finished (or run out of time) before uvicorn is told to stop.
        timeout_graceful_shutdown=2,
        # Longer than any common client keeps an idle connection (httpx and the OpenAI SDK 5 s,
        # Node's undici 4 s, aiohttp 15 s): at uvicorn's own 5 s, a client reusing a connection
        # just as the server closed it lost its request ("Server disconnected without sending a
        # response"); past its client's idle bound, the client closes it first.
        timeout_keep_alive=IDLE_CONNECTION_S,
        server_header=False,
        # Requests beyond --max-connections get a JSON 503 from DrainMiddleware; uvicorn's own
        # refusal (plain text) is only the backstop against a flood of idle kept-alive connections.
        limit_concurrency=2 * settings.max_connections,
        # A WebSocket message (a `/v1/realtime` event) is bounded as a body is: a larger one closes
        # its connection (1009, the reason naming the bound) before it is read whole.
        ws_max_size=settings.max_body_mb * 1024 * 1024,
        ssl_certfile=settings.certfile,
        ssl_keyfile=settings.keyfile,
    )
    _draining_server_class()(config, lifecycle, settings.drain_timeout_s).run(sockets=socks)
    return 0


def _draining_server_class():  # type: ignore[no-untyped-def]
    import asyncio

    import uvicorn

    class DrainingServer(uvicorn.Server):
        """On SIGTERM/SIGINT the server keeps listening while requests are in flight (up to
        --drain-timeout-s): /ready answers 503 and new work is refused (gateway/http/lifecycle.py), so a
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
    from gateway.doctor.cli import add_doctor_command
    from gateway.models.cli import add_model_commands
    from gateway.models.npu_cli import add_npu_command
    from gateway.ops.usage_cli import add_usage_command

    parser = argparse.ArgumentParser(prog="geniex", description="GenieX Server: local OpenAI-compatible inference")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = _add_serve(sub)
    _env_defaults(serve)
    serve.set_defaults(env_warnings=unknown_env(serve, os.environ))
    add_model_commands(sub)
    add_npu_command(sub)
    add_usage_command(sub)
    add_doctor_command(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
