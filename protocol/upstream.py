"""A model served elsewhere: the descriptor `geniex pull --upstream` writes into the store, and
the `upstream` worker engine reads as its "model file".

The descriptor names where the credential is (an environment variable's name, or a file's path),
never the credential itself, so a manifest can be read, copied or shown without leaking it.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import msgspec

# What an upstream may be asked for, as the gateway's capabilities name them (gateway/models/capabilities.py).
CAPABILITIES = ("chat", "completion", "tools", "embeddings", "rerank")
# Spellings the CLI accepts besides those above.
CAPABILITY_ALIASES = {"completions": "completion", "embedding": "embeddings", "reranking": "rerank"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_PATH_SEGMENT = re.compile(r"^[A-Za-z0-9._~/-]{1,64}$")
MAX_CONCURRENCY = 1024


class UpstreamError(ValueError):
    """A descriptor that cannot be served; the message names the field."""


class UpstreamSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One upstream model. `base_url` is the OpenAI-compatible `/v1` root (`https://host:8000/v1`);
    `model` the name the upstream knows it by. The credential, when there is one, comes from the
    environment variable `api_key_env` (in the server's environment: the systemd unit's
    EnvironmentFile, say) or from the file `api_key_file`, read when the worker starts."""

    base_url: str
    model: str
    api_key_env: str = ""
    api_key_file: str = ""
    capabilities: list[str] = msgspec.field(default_factory=lambda: ["chat", "completion", "tools"])
    connect_timeout: float = 5.0  # seconds to open a connection (beyond it: unreachable, 502)
    read_timeout: float = 120.0  # seconds without a byte from the upstream (beyond it: 504)
    max_concurrency: int = 32  # requests sent at once; more wait in the worker, then 503
    probe_interval: float = 15.0  # seconds between health probes (GET {base_url}/models)
    rerank_path: str = "rerank"  # POST {base_url}/{rerank_path}: vLLM's `rerank`, GenieX's `reranking`
    context_length: int = 0  # the upstream's context, when known (0: the server's --nctx)


def canonical_capabilities(names: list[str]) -> list[str]:
    out: list[str] = []
    for raw in names:
        name = CAPABILITY_ALIASES.get(raw.strip().lower(), raw.strip().lower())
        if name not in CAPABILITIES:
            raise UpstreamError(f"capability {raw!r}: expected some of {', '.join(CAPABILITIES)}")
        if name not in out:
            out.append(name)
    if "tools" in out and "chat" not in out:
        raise UpstreamError("capability 'tools' needs 'chat'")
    if not out:
        raise UpstreamError("an upstream needs at least one capability")
    return out


def validate(spec: UpstreamSpec) -> UpstreamSpec:
    """The spec with its base URL normalised (no trailing slash) and its capabilities canonical;
    UpstreamError for anything a worker could not use, or that would put a secret in the store."""
    url = spec.base_url.strip()
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is not a number
    except ValueError as exc:
        raise UpstreamError(f"base URL {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UpstreamError(f"base URL {url!r}: expected http(s)://host[:port]/v1")
    if parts.username is not None or parts.password is not None:
        raise UpstreamError("base URL: a user or password in the URL would be stored in plain text; "
                            "give the credential with an environment variable or a file instead")  # fmt: skip
    if parts.query or parts.fragment:
        raise UpstreamError(f"base URL {url!r}: no query or fragment (the /v1 root only)")
    if port is not None and not 0 < port < 65536:
        raise UpstreamError(f"base URL {url!r}: bad port")
    if not spec.model or len(spec.model) > 256 or any(c in spec.model for c in "\x00\r\n"):
        raise UpstreamError("upstream model: a name of 1 to 256 characters, one line")
    if spec.api_key_env and not _ENV_NAME.match(spec.api_key_env):
        raise UpstreamError(f"api_key_env {spec.api_key_env!r}: the NAME of an environment variable, not its value")
    if spec.api_key_env and spec.api_key_file:
        raise UpstreamError("give the credential by api_key_env or api_key_file, not both")
    if spec.api_key_file and (not spec.api_key_file.startswith("/") or "\x00" in spec.api_key_file):
        raise UpstreamError(f"api_key_file {spec.api_key_file!r}: an absolute path")
    for name, value in (("connect_timeout", spec.connect_timeout), ("read_timeout", spec.read_timeout),
                        ("probe_interval", spec.probe_interval)):  # fmt: skip
        if not 0 < value <= 3600:
            raise UpstreamError(f"{name}: seconds, more than 0 and at most 3600")
    if not 1 <= spec.max_concurrency <= MAX_CONCURRENCY:
        raise UpstreamError(f"max_concurrency: 1 to {MAX_CONCURRENCY}")
    if not _PATH_SEGMENT.match(spec.rerank_path) or ".." in spec.rerank_path:
        raise UpstreamError(f"rerank_path {spec.rerank_path!r}: a path below the base URL")
    if spec.context_length < 0:
        raise UpstreamError("context_length: 0 (unknown) or more")
    return msgspec.structs.replace(spec, base_url=url.rstrip("/"),
                                   capabilities=canonical_capabilities(spec.capabilities))  # fmt: skip


_decoder = msgspec.json.Decoder(UpstreamSpec)
_encoder = msgspec.json.Encoder()


def decode(data: bytes) -> UpstreamSpec:
    try:
        return validate(_decoder.decode(data))
    except msgspec.ValidationError as exc:
        raise UpstreamError(f"upstream descriptor: {exc}") from None
    except msgspec.DecodeError as exc:
        raise UpstreamError(f"upstream descriptor is not JSON: {exc}") from None


def encode(spec: UpstreamSpec) -> bytes:
    return _encoder.encode(spec)


def where(spec: UpstreamSpec) -> str:
    """How messages name the upstream: its URL and model, never its credential."""
    return f"upstream {spec.base_url} (model {spec.model!r})"
