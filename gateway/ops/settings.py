"""Server settings: every `geniex serve` flag, each also readable from `GENIEX_*`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import msgspec

DEFAULT_HOST = "127.0.0.1:18181"


def add_data_dir(p: argparse.ArgumentParser) -> None:
    """`--data-dir` for the commands that read the store or the ledger. The default is resolved
    when the command runs, so GENIEX_DATA_DIR set after the parser is built still counts."""
    p.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                   help="default: $GENIEX_DATA_DIR, $GENIEX_DATADIR or ~/.cache/geniex")  # fmt: skip


def default_data_dir() -> Path:
    """GENIEX_DATA_DIR (the `--data-dir` flag's variable), GENIEX_DATADIR (GenieX's own name), or ~/.cache/geniex."""
    env = os.environ.get("GENIEX_DATA_DIR") or os.environ.get("GENIEX_DATADIR")
    return Path(env).expanduser() if env else Path("~/.cache/geniex").expanduser()


class Settings(msgspec.Struct, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 18181
    nctx: int = 4096
    ngl: int = -1
    compute: str | None = None
    keepalive: float = 300.0
    origins: list[str] = []
    data_dir: Path = msgspec.field(default_factory=default_data_dir)
    log_level: str | None = None
    parallel: int = 0  # 0: chosen from nctx by the worker
    max_queue: int = 16
    max_loaded: int = 0  # 0: as many as memory allows
    memory_reserve_mb: int = 1024
    drain_timeout: float = 30.0
    load_timeout: float = 120.0
    preload: list[str] = []
    threads: int = 0  # 0: physical cores
    crash_limit: int = 3  # crashes within crash_window that trigger a backoff; 0 disables it
    crash_window: float = 60.0
    crash_backoff: float = 30.0
    stream_interval_ms: int = 20  # tokens closer together than this share one Delta/chunk (0: never)
    # Added to the workers' nice value (Linux/macOS). 0: the gateway's own. A higher value made
    # /health p99 slightly better on an idle box and decoding collapse beside any busy program.
    worker_nice: int = 0
    grammar_dirs: list[Path] = []  # where `grammar_path` may read from; none by default
    media_dirs: list[Path] = []  # where a chat image's local path may point; none by default
    cache_ram_mb: int = 1024  # each chat worker's prompt cache in host RAM (0: none)
    allowed_hosts: list[str] = []  # Host names answered besides loopback and the bound address ("*": any)
    api_keys: list[str] = []  # with any key (or a key file), every route but the probes needs one
    api_key_file: Path | None = None  # `KEY [LABEL] [rpm=N tpm=N concurrent=N]` per line; read again on SIGHUP
    metrics_key: bool = False  # /metrics needs a key too
    insecure_no_auth: bool = False  # bind beyond loopback without keys anyway
    certfile: Path | None = None  # with keyfile: HTTPS
    keyfile: Path | None = None
    max_connections: int = 512  # requests at once; beyond it a 503 (connections: twice it)
    max_body_mb: int = 32  # a larger request body is a 413 (images and audio travel inside it)
    fetch_hosts: list[str] = []  # hosts whose http(s) URLs a request may name for images and audio; none by default
    max_nctx: int = 0  # the largest per-request `nctx`; 0: the context each model was trained for
    webui: bool = True  # the web UI at /, /ops, /try, /docs and /openapi.json


def split_host(value: str) -> tuple[str, int]:
    """`host:port`, `host` or `:port`; IPv6 as `[::1]:port`."""
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        return host, int(rest.lstrip(":") or 18181)
    if value.count(":") == 1:
        host, port = value.split(":")
        return host or "127.0.0.1", int(port)
    return value, 18181
