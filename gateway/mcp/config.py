"""`--mcp-config`: the MCP servers a request may use, in the format desktop assistants read.

```json
{"mcpServers": {
  "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/docs"],
            "env": {"LOG_LEVEL": "warn"}},
  "search": {"url": "https://search.example/mcp", "headers": {"Authorization": "Bearer ..."},
             "requestHeaders": ["X-User"]}
}}
```

A server with `command` runs over stdio, started by the gateway (gateway/mcp/hub.py); one with
`url` is reached over streamable HTTP at that URL only. `type` may say which (`stdio`, `http`,
`streamable-http`), as some clients write it; the older SSE transport is refused by name.
`requestHeaders` (GenieX's own) names the headers a request's `mcp` tool may set for that server;
without it a request sets none. A request names a server by its label and nothing else: no
command, path or URL of a request ever reaches here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

LABEL = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TYPES = {"stdio": "stdio", "http": "http", "streamable-http": "http", "streamableHttp": "http"}
# Headers the HTTP client sets itself, or that would let a request speak for the gateway.
_NEVER_FROM_REQUESTS = frozenset({"host", "content-length", "content-type", "accept", "connection",
                                  "transfer-encoding", "mcp-session-id", "mcp-protocol-version"})  # fmt: skip


class McpConfigError(ValueError):
    pass


class _Entry(msgspec.Struct, kw_only=True, rename={"request_headers": "requestHeaders"}):
    type: str | None = None
    command: Annotated[str, Meta(min_length=1)] | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = {}
    request_headers: list[str] = []
    disabled: bool = False


class _File(msgspec.Struct, rename={"servers": "mcpServers"}):
    servers: dict[str, dict[str, Any]]


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One server as the operator configured it."""

    label: str
    command: str = ""  # stdio: what to run, with `args`, `env` (over a minimal environment) and `cwd`
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str = ""  # streamable HTTP
    headers: dict[str, str] = {}
    request_headers: frozenset[str] = frozenset()  # lower case

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"


def _server(label: str, raw: dict[str, Any]) -> ServerConfig:
    if not LABEL.fullmatch(label):
        raise McpConfigError(f"server {label[:80]!r}: a name is 1 to 64 letters, digits, `_` or `-` (requests name "
                             "it as `server_label`)")  # fmt: skip
    try:
        e = msgspec.convert(raw, _Entry)
    except msgspec.ValidationError as exc:
        raise McpConfigError(f"server {label}: {exc}") from None
    kind = _TYPES.get(e.type or ("stdio" if e.command else "http"))
    if kind is None:
        why = "the SSE transport is not supported; use the server's streamable HTTP endpoint" if e.type == "sse" else \
            "expected stdio, http or streamable-http"  # fmt: skip
        raise McpConfigError(f"server {label}: type {e.type!r}: {why}")
    if kind == "stdio":
        if not e.command or e.url:
            raise McpConfigError(f"server {label}: a stdio server has a `command` and no `url`")
        return ServerConfig(label=label, command=e.command, args=tuple(e.args), env=dict(e.env), cwd=e.cwd)
    if not e.url or e.command:
        raise McpConfigError(f"server {label}: an HTTP server has a `url` and no `command`")
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", e.url):
        raise McpConfigError(f"server {label}: `url` {e.url[:200]!r} is not an http(s) URL")
    allowed = frozenset(h.lower() for h in e.request_headers)
    if bad := sorted(allowed & _NEVER_FROM_REQUESTS):
        raise McpConfigError(f"server {label}: `requestHeaders` may not include {', '.join(bad)}")
    return ServerConfig(label=label, url=e.url, headers=dict(e.headers), request_headers=allowed)


def load(path: Path | None) -> dict[str, ServerConfig]:
    """The configured servers by label (none without a file); McpConfigError says what is wrong."""
    if path is None:
        return {}
    try:
        raw = msgspec.json.decode(path.read_bytes(), type=_File)
    except OSError as exc:
        raise McpConfigError(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise McpConfigError(f'{exc} (expected {{"mcpServers": {{"name": {{...}}}}}})') from None
    servers: dict[str, ServerConfig] = {}
    for label, entry in raw.servers.items():
        config = _server(label, entry)
        if not entry.get("disabled"):
            servers[label] = config
    return servers


def same_url(configured: str, asked: str) -> bool:
    """Whether a request's `server_url` names the configured URL (a trailing `/` aside)."""
    return configured.rstrip("/") == asked.rstrip("/")
