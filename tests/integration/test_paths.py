"""Path confinement, proved from outside: every path-like field of a request, and every file name
a manifest gives `geniex rm`, stays inside the directories the operator allowed.

Canaries sit outside those directories: a grammar file that would force the answer "CANARY", a
GGUF-looking draft model, and files a hostile manifest names for deletion. Their access times are
set before their modification times, so a read would move them (relatime updates a stale
atime); each hostile value must get a 400 or 404, and every canary must be untouched after.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.conftest import MODEL
from tests.server_proc import ServerProcess

CANARY_GRAMMAR = 'root ::= "CANARY"\n'


def hostile_values(canary_dir: Path, allowed: Path) -> list[str]:
    """Path spellings an attacker tries, aimed at `canary_dir`'s files from inside `allowed`."""
    up = os.path.relpath(canary_dir, allowed)  # ../canary
    c = str(canary_dir)
    values = [
        f"{c}/canary.gbnf", f"{c}/canary.gguf", f"{up}/canary.gbnf", f"{up}/canary.gguf",
        f"{allowed}/../{os.path.basename(c)}/canary.gbnf", f"{allowed}/{up}/canary.gguf",
        "../" * 12 + "etc/passwd", "/etc/passwd", "/etc/shadow", "/proc/self/environ", "/proc/self/cmdline",
        "/dev/zero", "/dev/urandom", "/dev/stdin", "/", ".", "..", "./", "../", "...", "....//....//etc/passwd",
        "~", "~/.ssh/id_rsa", "~root/.bashrc", "$HOME/.bashrc", "${HOME}/x",
        "%2e%2e%2fetc%2fpasswd", "..%2f..%2fetc%2fpasswd", "%2e%2e/%2e%2e/etc/passwd", "..%252f..%252fetc",
        "..%c0%af..%c0%afetc", "%00", "x\x00.gbnf", f"{c}/canary.gbnf\x00.ok",
        "C:\\Windows\\win.ini", "C:/Windows/win.ini", "\\\\server\\share\\x", "..\\..\\etc\\passwd",
        "\\..\\..\\etc\\passwd", "file:///etc/passwd", f"file://{c}/canary.gbnf", "http://127.0.0.1:1/x",
        "escape.gbnf", "link-out/canary.gbnf", "link-out", "a" * 300, "a/" * 2000 + "x", "x" * 5000,
        " /etc/passwd", "/etc/passwd ", "\n/etc/passwd", "/./etc/./passwd", "//etc//passwd", "/etc/passwd/.",
        "…/…/etc/passwd", "\u202e/etc/passwd", "NUL", "CON", "aux.gbnf",
        "org/../../canary", "../org/repo", "org/repo/../../..", "org/.hidden", ".partial/x", "org/repo:../../x",
    ]  # fmt: skip
    assert len(values) >= 50
    return values


def _stale_atime(path: Path) -> None:
    st = path.stat()
    os.utime(path, (st.st_mtime - 86400, st.st_mtime))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path, Path]]:
    """A server whose grammar folder holds a symlink out to the canaries, and the canaries."""
    base = tmp_path_factory.mktemp("confine")
    allowed, canary = base / "grammars", base / "canary"
    allowed.mkdir()
    canary.mkdir()
    (canary / "canary.gbnf").write_text(CANARY_GRAMMAR)
    (canary / "canary.gguf").write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 64)
    (allowed / "escape.gbnf").symlink_to(canary / "canary.gbnf")
    (allowed / "link-out").symlink_to(canary, target_is_directory=True)
    (allowed / "ok.gbnf").write_text('root ::= "ok"\n')
    (allowed / "bad.gbnf").write_text('root ::= "a" | undefined-rule\n' + 'secret ::= "TOPSECRET"\n' * 50)
    for f in canary.iterdir():
        _stale_atime(f)
    srv = ServerProcess(base / "data", "--nctx", "512", "--grammar-dir", str(allowed))
    try:
        srv.wait_ready()
        yield srv, allowed, canary
    finally:
        srv.stop()


def _untouched(canary: Path) -> None:
    for f in canary.iterdir():
        st = f.stat()
        assert st.st_atime < st.st_mtime, f"{f} was read"
    assert (canary / "canary.gbnf").read_text() == CANARY_GRAMMAR
    _stale_atime(canary / "canary.gbnf")  # read just now, by this check


def test_path_fields_of_a_request_stay_inside_the_allowed_folders(site: tuple[ServerProcess, Path, Path]) -> None:
    srv, allowed, canary = site
    chat = f"{srv.base_url}/v1/chat/completions"
    hi = [{"role": "user", "content": "Say a word."}]
    ok = httpx.post(
        chat, json={"model": MODEL, "messages": hi, "max_tokens": 4, "grammar_path": "ok.gbnf"}, timeout=120
    )
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "ok", ok.text
    tried = 0
    # One client for the 260 requests: httpx.post builds a client, and loads its TLS context, per
    # call (some 30 ms each, most of this test's time); the server sees the same requests either way.
    with httpx.Client(timeout=60) as http:
        for value in hostile_values(canary, allowed):
            bodies = {
                "grammar_path": {"model": MODEL, "messages": hi, "max_tokens": 4, "grammar_path": value},
                "spec_draft_model": {"model": MODEL, "messages": hi, "max_tokens": 4, "spec_type": "draft-simple",
                                     "spec_draft_model": value},
                "model": {"model": value, "messages": hi, "max_tokens": 4},
            }  # fmt: skip
            for field, body in bodies.items():
                r = http.post(chat, json=body)
                assert r.status_code in (400, 404), (field, value, r.status_code, r.text[:300])
                assert "CANARY" not in r.text and "root:" not in r.text, (field, value, r.text[:300])
                assert isinstance(r.json()["error"], str)
                tried += 1
            # Escaped whole (dots too, or the client would resolve `..` itself), so the server decodes it.
            r = http.get(f"{srv.base_url}/v1/models/{quote(value, safe='').replace('.', '%2E')}", timeout=30)
            if r.status_code == 200:  # "/" decodes to /v1/models//, which routes to the list
                assert r.json().get("object") == "list", (value, r.text[:300])
            else:
                assert r.status_code in (400, 404) and isinstance(r.json()["error"], str), (
                    value,
                    r.status_code,
                    r.text[:300],
                )
            tried += 1
    assert tried >= 200
    _untouched(canary)
    assert httpx.get(f"{srv.base_url}/health", timeout=10).status_code == 200


def _geniex(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GENIEX_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, env=env,
                          timeout=60, check=False)  # fmt: skip


def test_rm_never_deletes_what_a_manifest_names_outside_its_folder(tmp_path: Path) -> None:
    """A manifest is a file anyone with write access to the store can edit: its names are not
    trusted. Each hostile name is refused by `geniex rm`, and `geniex list` never offers it."""
    names = [str(tmp_path / "{case}" / "canary" / "passwd"), "../../../../canary/passwd", "..", ".", "", "../repo2",
             "/", "a/../../x", "..\\..\\canary\\passwd", "C:\\canary", "x\x00y", "link.gguf"]  # fmt: skip
    # Each name gets a store and victims of its own, so the 24 CLI runs (a Python start-up each,
    # nearly all of this test's time) can overlap; a victim deleted still names its manifest.
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda case: _rm_refuses(tmp_path / str(case[0]), case[1].format(case=case[0])),
                      enumerate(names)))  # fmt: skip


def _rm_refuses(case: Path, name: str) -> None:
    data, canary = case / "data", case / "canary"
    canary.mkdir(parents=True)
    victims = {"passwd": canary / "passwd", "dir": canary / "dir"}
    victims["passwd"].write_text("keep me")
    victims["dir"].mkdir()
    (victims["dir"] / "f").write_text("keep me too")
    repo = data / "models" / "org" / "repo"
    repo.mkdir(parents=True)
    (repo / "link.gguf").symlink_to(victims["passwd"])
    variants = {"Q4_0": {"file": name, "size": 1, "created": 0, "source": "x"}}
    (repo / "manifest.json").write_text(json.dumps({"org": "org", "repo": "repo", "engine": "llama_cpp",
                                                    "variants": variants}))  # fmt: skip
    listed = _geniex(data, "list")
    if name != "link.gguf":
        assert not any(line.startswith("org/repo") for line in listed.stdout.splitlines()), (name, listed.stdout)
    out = _geniex(data, "rm", "org/repo:Q4_0")
    assert "Traceback" not in out.stderr, (name, out.stderr)
    assert victims["passwd"].read_text() == "keep me", name
    assert (victims["dir"] / "f").read_text() == "keep me too", name
    shutil.rmtree(data)


def test_a_parser_error_quotes_its_first_line_not_the_file(site: tuple[ServerProcess, Path, Path]) -> None:
    srv, _allowed, _canary = site
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "grammar_path": "bad.gbnf",
    }
    r = httpx.post(f"{srv.base_url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"].startswith("`grammar_path`: invalid grammar"), r.text
    assert "TOPSECRET" not in r.text and len(r.json()["error"]) < 400, r.text
