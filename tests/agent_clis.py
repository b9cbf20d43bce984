"""The real agent CLIs, from npm, for tests/integration/test_agent_clis.py.

Agent CLIs change what they send every few weeks, so the suite runs the registry's current
releases: they are installed into a cache (`~/.cache/geniex/agent-clis`, or
`$GENIEX_AGENT_CLIS`) and brought up to date at most once a day. When the registry cannot be
reached, the cached ones are used; with none cached, the tests skip saying why.

Current Claude Code needs Node 22; where the machine's node is older, Node 22 comes
from npm too (the `node-linux-<arch>` package carries the binary), and npm runs under it so that
it resolves the releases that Node 22 can run.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("GENIEX_AGENT_CLIS") or Path.home() / ".cache" / "geniex" / "agent-clis")
# Codex speaks Responses, Claude Code Anthropic's Messages, pi (a small coding agent) Chat Completions;
# `ollama` is Ollama's JavaScript client (a library, no command), for tests/integration/test_ollama.py.
PACKAGES = ("@openai/codex", "@anthropic-ai/claude-code", "@mariozechner/pi-coding-agent", "ollama")
COMMANDS = ("codex", "claude", "pi")
LIBRARIES = ("ollama",)
NODE_MAJOR = 22
REFRESH_S = 24 * 3600
INSTALL_TIMEOUT_S = 300
VERSIONS = CACHE / "versions.json"  # what the last test run used; tests/conftest.py prints it
# The cache's age is judged as of this process's start, not of each call: a stamp that turns a day
# old mid-run would otherwise send a later test (Ollama's JavaScript client, minutes after the agent
# CLIs found the cache fresh) into a 20 s npm install. A stamp written by this run counts as fresh.
_STARTED = time.time()


@dataclass(frozen=True)
class Clis:
    node_bin: Path  # the folder of a node >= NODE_MAJOR, first on the CLIs' PATH
    bin: Path  # node_modules/.bin of the installed CLIs

    @property
    def modules(self) -> Path:
        """The folder a script run there imports the installed packages from (`import ... from "ollama"`)."""
        return self.bin.parent.parent

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        """A clean environment for one run: its own HOME (no user config, no login), no proxy."""
        keep = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TERM", "TMPDIR")}
        return {**keep, "HOME": str(home), "PATH": f"{self.node_bin}{os.pathsep}{os.environ.get('PATH', '')}",
                "NO_COLOR": "1", "CI": "1", **extra}  # fmt: skip

    def version(self, name: str) -> str:
        out = subprocess.run([str(self.bin / name), "--version"], capture_output=True, text=True, timeout=60,
                             env=self.env(CACHE))  # fmt: skip
        return (out.stdout or out.stderr).strip().splitlines()[-1] if (out.stdout or out.stderr).strip() else "?"


def _node_major(node: str) -> int:
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
        return int(out.strip().lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.SubprocessError):
        return 0


def _npm_cli() -> Path | None:
    """npm's own script, to run under another node than the one its launcher names."""
    npm = shutil.which("npm")
    if npm is None:
        return None
    real = Path(os.path.realpath(npm))
    for candidate in (real, real.parent / "npm-cli.js", real.parent.parent / "lib/node_modules/npm/bin/npm-cli.js"):
        if candidate.suffix == ".js" and candidate.is_file():
            return candidate
    return None


def _run(cmd: list[str], env: dict[str, str] | None = None) -> str:
    """Runs an install step; its last lines of output when it fails, else ''."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return f"{' '.join(cmd[:3])} ... took over {INSTALL_TIMEOUT_S} s"
    if out.returncode == 0:
        return ""
    return "\n".join((out.stderr or out.stdout).strip().splitlines()[-5:]) or f"exit {out.returncode}"


def _node_bin(npm_cli: Path) -> tuple[Path | None, str]:
    system = shutil.which("node")
    if system and _node_major(system) >= NODE_MAJOR:
        return Path(system).parent, ""
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    package = f"node-{platform.system().lower()}-{arch}"
    bundled = CACHE / "node" / "node_modules" / package / "bin"
    if not (bundled / "node").exists():
        failed = _run([system or "node", str(npm_cli), "install", "--no-audit", "--no-fund", "--prefix",
                       str(CACHE / "node"), f"{package}@{NODE_MAJOR}"])  # fmt: skip
        if failed:
            return None, f"Node {NODE_MAJOR} from npm ({package}): {failed}"
    return bundled, ""


def install() -> Clis | str:
    """The installed CLIs, brought up to date if the cache is a day old; or why there are none."""
    npm_cli = _npm_cli()
    if npm_cli is None:
        return "npm is not installed (`make install-test` installs it as root; else `apt-get install npm`)"
    CACHE.mkdir(parents=True, exist_ok=True)
    node_bin, why = _node_bin(npm_cli)
    if node_bin is None:
        return why
    clis = Clis(node_bin=node_bin, bin=CACHE / "clis" / "node_modules" / ".bin")
    stamp = CACHE / "clis" / ".updated"
    have = all((clis.bin / n).exists() for n in COMMANDS) and all((clis.modules / "node_modules" / n).exists()
                                                                  for n in LIBRARIES)  # fmt: skip
    if have and stamp.exists() and _STARTED - stamp.stat().st_mtime < REFRESH_S:
        return clis
    env = {**os.environ, "PATH": f"{node_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    failed = _run([str(node_bin / "node"), str(npm_cli), "install", "--no-audit", "--no-fund", "--prefix",
                   str(CACHE / "clis"), *(f"{p}@latest" for p in PACKAGES)], env)  # fmt: skip
    if not failed:
        stamp.touch()
        return clis
    if have:
        return clis  # the registry is out of reach: yesterday's releases still test the server
    return f"the agent CLIs could not be installed from npm: {failed}"


def record_versions(versions: dict[str, str]) -> None:
    VERSIONS.write_text(json.dumps({"at": time.time(), "versions": versions}))
