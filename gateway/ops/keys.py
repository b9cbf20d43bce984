"""API keys: who may call the server, and the name each caller goes by in the ledger and logs.

Keys come from `--api-key` (repeatable) and `--api-key-file` (one key per line, an optional label
and optional limits after it, `#` comments: `KEY [LABEL] [rpm=N] [tpm=N] [concurrent=N]`), and the
file is read again on SIGHUP. A key is never kept or logged in
the clear beyond this object: callers are named by their label, or by a hash of the key.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path

from gateway.ops.limits import Limits

MIN_KEY_CHARS = 8
NO_LIMITS = Limits()


class KeyFileError(ValueError):
    pass


@dataclass(frozen=True)
class Key:
    digest: bytes  # sha256 of the key
    label: str
    limits: Limits = NO_LIMITS


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def default_label(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


def parse_key_file(text: str) -> list[tuple[str, str, Limits]]:
    """(key, label, limits) per line: `KEY [LABEL] [rpm=N] [tpm=N] [concurrent=N]`; blank lines and
    `#` comments are skipped."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        key, rest = words[0], words[1:]
        if len(key) < MIN_KEY_CHARS:
            raise KeyFileError(f"line {n}: a key has at least {MIN_KEY_CHARS} characters")
        label = rest.pop(0) if rest and "=" not in rest[0] else default_label(key)
        try:
            limits = Limits.parse(rest)
        except ValueError as exc:
            raise KeyFileError(f"line {n}: {exc}") from None
        out.append((key, label, limits))
    return out


class KeyRing:
    def __init__(self, keys: list[str], key_file: Path | None = None) -> None:
        self._flag_keys = [(k, default_label(k), NO_LIMITS) for k in keys]
        self.key_file = key_file
        self.keys: list[Key] = []
        self.reload()

    def reload(self) -> None:
        """Read the key file again (SIGHUP); a file that cannot be read keeps the keys as they were."""
        pairs = list(self._flag_keys)
        if self.key_file is not None:
            pairs += parse_key_file(self.key_file.read_text())
        self.keys = [Key(_digest(k), label, limits) for k, label, limits in pairs]

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
