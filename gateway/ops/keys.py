"""API keys: who may call the server, and the name each caller goes by in the ledger and logs.

Keys come from `--api-key` (repeatable) and `--api-key-file` (one key per line, an optional label
and optional words after it, `#` comments: `KEY [LABEL] [rpm=N] [tpm=N] [concurrent=N] [manage=yes] [mcp=a,b]
[priority=interactive|normal|background]`),
and the file is read again on SIGHUP. A key is never kept or logged in
the clear beyond this object: callers are named by their label, or by a hash of the key.

Managing models (pulling, deleting, copying them over HTTP) is a right of its own: a key given
with `--api-key` has it (whoever sets the server's flags owns it), a key-file key only with
`manage=yes`, so that a team's keys can use models without filling or emptying the disk.

The MCP servers of `--mcp-config` are a right too: a key-file key uses the servers its `mcp=`
names (`mcp=*`: all of them), none without it; a `--api-key` key uses all.

A key's `priority=` is where its requests stand against others' (protocol/priority.py): a team's
background agent's key says `priority=background`, and its holder may lower its requests' priority
with the `GenieX-Priority` header but not raise it above the key's.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path

from gateway.ops.limits import Limits
from protocol.priority import PRIORITIES

MIN_KEY_CHARS = 8
NO_LIMITS = Limits()


class KeyFileError(ValueError):
    pass


MANAGE = "manage"
MCP = "mcp"
PRIORITY = "priority"
ALL_SERVERS = "*"
_YES = {"yes": True, "true": True, "no": False, "false": False}


@dataclass(frozen=True)
class Key:
    digest: bytes  # sha256 of the key
    label: str
    limits: Limits = NO_LIMITS
    manage: bool = False  # may pull, delete and copy models
    mcp: frozenset[str] | None = frozenset()  # the MCP servers it may use; None: all
    priority: str | None = None  # the highest its requests get (None: whatever they ask)


@dataclass(frozen=True)
class KeyLine:
    """One line of the key file."""

    key: str
    label: str
    limits: Limits = NO_LIMITS
    manage: bool = False
    mcp: frozenset[str] | None = frozenset()
    priority: str | None = None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def default_label(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


def parse_key_lines(text: str) -> list[KeyLine]:
    """One KeyLine per line: `KEY [LABEL] [rpm=N] [tpm=N] [concurrent=N] [manage=yes|no] [mcp=a,b]
    [priority=P]`; blank
    lines and `#` comments are skipped."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        key, rest = words[0], words[1:]
        if len(key) < MIN_KEY_CHARS:
            raise KeyFileError(f"line {n}: a key has at least {MIN_KEY_CHARS} characters")
        label = rest.pop(0) if rest and "=" not in rest[0] else default_label(key)
        manage = False
        mcp: frozenset[str] | None = frozenset()
        priority: str | None = None
        limit_words = []
        for word in rest:
            name, _, value = word.partition("=")
            if name == PRIORITY:
                if value not in PRIORITIES:
                    raise KeyFileError(f"line {n}: {word!r}: `priority` is one of {', '.join(PRIORITIES)}")
                priority = value
            elif name == MCP:
                servers = frozenset(v for v in value.split(",") if v)
                mcp = None if ALL_SERVERS in servers else servers
            elif name != MANAGE:
                limit_words.append(word)
            elif value.lower() in _YES:
                manage = _YES[value.lower()]
            else:
                raise KeyFileError(f"line {n}: {word!r}: `manage` is yes or no")
        try:
            limits = Limits.parse(limit_words)
        except ValueError as exc:
            raise KeyFileError(f"line {n}: {exc}, manage=yes (the key may pull, delete and copy models), mcp=a,b "
                               "(the MCP servers it may use; * for all), or priority=interactive|normal|background") from None  # fmt: skip
        out.append(KeyLine(key, label, limits, manage, mcp, priority))
    return out


def parse_key_file(text: str) -> list[tuple[str, str, Limits]]:
    """(key, label, limits) per line of the key file (parse_key_lines without the rights)."""
    return [(k.key, k.label, k.limits) for k in parse_key_lines(text)]


class KeyRing:
    def __init__(self, keys: list[str], key_file: Path | None = None) -> None:
        # The flags' keys manage models: they belong to whoever runs the server.
        self._flag_keys = [KeyLine(k, default_label(k), NO_LIMITS, manage=True, mcp=None) for k in keys]
        self.key_file = key_file
        self.keys: list[Key] = []
        self.reload()

    def reload(self) -> None:
        """Read the key file again (SIGHUP); a file that cannot be read keeps the keys as they were."""
        lines = list(self._flag_keys)
        if self.key_file is not None:
            lines += parse_key_lines(self.key_file.read_text())
        self.keys = [Key(_digest(k.key), k.label, k.limits, k.manage, k.mcp, k.priority) for k in lines]

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def check(self, presented: str) -> Key | None:
        """The key matching `presented`, compared in constant time against every key."""
        digest = _digest(presented)
        found = None
        for key in self.keys:
            if hmac.compare_digest(digest, key.digest):
                found = key
        return found
